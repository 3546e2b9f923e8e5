"""The documentation: the site builds, the README's quick starts run, release facts have one source.

The site (docs/, Sphinx + MyST; `make docs`) is built as `make docs` builds it: warnings are
errors and internal links are checked (`-W -n`). The README's ```python / ```sh blocks are
tagged and run as the migration guide's are (tests/test_migration_guide.py: on jax 0.6.0
in-process, on the newest line in that environment's interpreter; `two-envs` shell blocks
once); command synopses that are not programs are ```text. The releases the packages support
are listed once, in shard_map_impl/supported_jax.py: the docs read them from there.
"""
from __future__ import annotations

import ast
import glob
import os
import re
import subprocess
import sys

import pytest

from support import venvs
from test_migration_guide import (FENCE, TAGS, Block, _run_blocks_job, _run_shell,
                                  run_block_here, tagged_blocks)

pytestmark = pytest.mark.jax06_only(reason="builds the site and runs the README on every JAX line")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
NEW = venvs.NEWEST


def _readme() -> str:
  with open(README, encoding="utf-8") as f:
    return f.read()


def _blocks() -> list[Block]:
  return tagged_blocks(_readme())


def test_site_builds_without_warnings(tmp_path):
  cmd = [os.path.join(os.path.dirname(sys.executable), "sphinx-build"), "-W", "--keep-going",
         "-n", "-q", "-b", "html", os.path.join(ROOT, "docs"), str(tmp_path / "html")]
  r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
  for page in ("index", "migration_guide", "codemod", "pmap_compat", "testing", "versions",
               "benchmarks", "architecture", "CONTRIBUTING"):
    assert (tmp_path / "html" / f"{page}.html").exists(), page


def test_readme_blocks_are_tagged_and_unique():
  blocks = _blocks()
  assert len(FENCE.findall(_readme())) == len(blocks), (
      "every ```python / ```sh block in README.md needs a `<!-- block: NAME -->` line "
      "(synopses that do not run are ```text)")
  names = [b.name for b in blocks]
  assert len(set(names)) == len(names), f"duplicate block names: {names}"
  assert not [b for b in blocks if b.tags - TAGS], f"unknown tags (known: {sorted(TAGS)})"


def test_readme_links_to_files_that_exist():
  links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", _readme())
  assert links
  missing = [link for link in links if not os.path.exists(os.path.join(ROOT, link))]
  assert not missing, f"README links to missing files: {missing}"


@pytest.mark.parametrize("block", [pytest.param(b, id=b.name) for b in _blocks()
                                   if b.runs_on("0.6.0")])
def test_readme_block_runs_on_jax_0_6_0(block: Block):
  run_block_here(block, "README.md", "__readme__")


@pytest.mark.parametrize("block", [pytest.param(b, id=b.name) for b in _blocks()
                                   if b.runs_on(NEW)])
def test_readme_block_runs_on_newest_jax(block: Block, tmp_path):
  if block.lang == "sh":
    _run_shell(block.code, venvs.python_for(NEW))
    return
  [results] = _run_blocks_job(NEW, [block], str(tmp_path), processes=1)
  assert results[block.name] == "ok", results[block.name]


def _tested() -> tuple[str, ...]:
  sys.path.insert(0, os.path.join(ROOT, "docs"))
  try:
    import conf  # pylint: disable=import-outside-toplevel
  finally:
    sys.path.pop(0)
  return conf.TESTED


def test_release_facts_have_one_source():
  """shard_map_impl/supported_jax.py lists the tested releases; the Makefile's environments,
  pyproject's range and the docs (docs/conf.py reads the list) follow it, and no module
  docstring states a supported range or list of its own (they drift: say where it is)."""
  from shard_map_impl.supported_jax import TESTED  # pylint: disable=import-outside-toplevel
  assert _tested() == TESTED
  with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
    make = f.read()
  var = lambda name: re.search(rf"^{name} :=(.*)$", make, re.M).group(1).split()
  newest = var("NEWEST_JAX")
  assert (venvs.LEGACY, *var("SUITE_JAX"), *newest) == TESTED, "Makefile SUITE_JAX vs TESTED"
  extra = [newest[0] if v == "$(NEWEST_JAX)" else v for v in var("EXTRA_JAX")]
  assert sorted({venvs.LEGACY, *extra}) == sorted(venvs.RELEASES), "EXTRA_JAX vs RELEASES"
  with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
    pyproject = f.read()
  for dist in ("jax", "jaxlib"):
    assert f'"{dist}>={TESTED[0]},<={TESTED[-1]}"' in pyproject, dist
  stated = re.compile(r"\b\d+\.\d+\.\d+\s*(?:to|and|or|–|-)\s*\d+\.\d+\.\d+\b")
  release = re.compile(r"\b0\.\d+\.\d+\b")
  wrong = []
  for package in ("shard_map_impl", "pmap_compat", "codemod"):
    for path in glob.glob(os.path.join(ROOT, package, "**", "*.py"), recursive=True):
      with open(path, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
      rel = os.path.relpath(path, ROOT)
      pattern = release if path.endswith("__init__.py") else stated
      wrong += [f"{rel}: {m!r}" for m in pattern.findall(doc)]
  assert not wrong, ("module docstrings that state supported releases (point at "
                     "shard_map_impl/supported_jax.py or docs/versions.md instead):\n"
                     + "\n".join(wrong))
