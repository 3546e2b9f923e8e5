"""The output a team keeps: on the examples and fixtures, on average at most 8 added lines
per converted site (imports included), no block of 6+ added lines repeated across
converted files, and in most converted files the site itself calls shard_map."""
import difflib
import glob
import os

import pytest

from codemod_testing import rewrite
from support.venvs import ROOT

FILES = sorted(glob.glob(os.path.join(ROOT, "examples", "*.py"))
               + glob.glob(os.path.join(os.path.dirname(__file__), "fixtures", "*.py")))
BLOCK = 6


def _added_runs(old: str, new: str) -> list[list[str]]:
  """The runs of consecutive added lines in the diff."""
  runs, current = [], []
  for line in difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0):
    if line.startswith("+") and not line.startswith("+++"):
      current.append(line[1:])
    elif current:
      runs.append(current)
      current = []
  return runs + ([current] if current else [])


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


def test_at_most_8_added_lines_per_converted_site(converted):
  _, files = converted
  added = sum(len(line) for _, old, new, _ in files for line in _added_runs(old, new))
  sites = sum(s for *_, s in files)
  assert sites >= len(files)
  assert added / sites <= 8, f"{added} added lines for {sites} sites"


def test_no_block_of_6_added_lines_is_repeated_across_files(converted):
  _, files = converted
  seen: dict[tuple, str] = {}
  for name, old, new, _ in files:
    for run in _added_runs(old, new):
      for i in range(len(run) - BLOCK + 1):
        block = tuple(line.strip() for line in run[i:i + BLOCK])
        assert seen.setdefault(block, name) == name, (
            f"{name} and {seen[block]} both add:\n" + "\n".join(block))


def test_most_converted_files_call_shard_map_at_the_site(converted):
  target, files = converted
  call = "partial(shard_map," if target == "experimental" else "partial(jax.shard_map,"
  call = "".join(call.split())
  at_site = [name for name, _, new, sites in files if sites and call in "".join(new.split())]
  assert len(at_site) == len([f for f in files if f[3]]), at_site
