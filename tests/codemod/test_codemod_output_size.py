"""The output a team keeps: on the examples and fixtures, on average at most 9 added lines
per converted site (imports, and the mesh statement with the blank lines PEP 8 wants
around it, included), no block of 6+ added lines repeated across converted files (unless
it converts the same source text: the same pmap site in two files converts the same way),
and in most converted files the site itself calls shard_map."""
import difflib
import glob
import os

import pytest

from codemod_testing import rewrite
from support.venvs import ROOT

FILES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.py"))
               + glob.glob(os.path.join(os.path.dirname(__file__), "fixtures", "*.py")))
BLOCK = 6


def _hunks(old: str, new: str) -> list[tuple[list[str], list[str]]]:
  """The diff's hunks: the lines each removes and the run of lines it adds."""
  hunks: list[tuple[list[str], list[str]]] = []
  for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0):
    if line.startswith("@@"):
      hunks.append(([], []))
    elif line.startswith("-") and not line.startswith("---"):
      hunks[-1][0].append(line[1:])
    elif line.startswith("+") and not line.startswith("+++"):
      hunks[-1][1].append(line[1:])
  return hunks


def _added_runs(old: str, new: str) -> list[list[str]]:
  """The runs of consecutive added lines in the diff."""
  return [added for _, added in _hunks(old, new) if added]


@pytest.fixture(scope="module", params=["experimental", "jax"])
def converted(request):
  out = []
  for path in FILES:
    with open(path, encoding="utf-8") as f:
      old = f.read()
    new, findings = rewrite(old, target=request.param)
    sites = sum(f.message.startswith("pmap converted") for f in findings)
    out.append((os.path.basename(path), old, new, sites))
  return request.param, out


def test_at_most_9_added_lines_per_converted_site(converted):
  _, files = converted
  added = sum(len(run) for _, old, new, _ in files for run in _added_runs(old, new))
  sites = sum(s for *_, s in files)
  assert sites >= len(files)
  assert added / sites <= 9, f"{added} added lines for {sites} sites"


def test_no_block_of_6_added_lines_is_repeated_across_files(converted):
  _, files = converted
  seen: dict[tuple, tuple[str, tuple]] = {}
  for name, old, new, _ in files:
    for removed, run in _hunks(old, new):
      source = tuple(line.strip() for line in removed)
      for i in range(len(run) - BLOCK + 1):
        block = tuple(line.strip() for line in run[i:i + BLOCK])
        first, first_source = seen.setdefault(block, (name, source))
        assert first == name or (source and first_source == source), (
            f"{name} and {first} both add:\n" + "\n".join(block))


def test_most_converted_files_call_shard_map_at_the_site(converted):
  target, files = converted
  shard_map = "shard_map" if target == "experimental" else "jax.shard_map"
  # A decorator (functools.partial(shard_map, ...)) or a call (jax.jit(shard_map(...))).
  calls = (f"partial({shard_map},", f"jax.jit({shard_map}(")
  at_site = [name for name, _, new, sites in files
             if sites and any(call in "".join(new.split()) for call in calls)]
  assert len(at_site) == len([f for f in files if f[3]]), at_site
