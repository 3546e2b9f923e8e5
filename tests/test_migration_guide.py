"""Executes every code block of migration_guide.md on jax 0.6.0 and jax 0.10.2.

Each fenced ```python / ```sh block must follow a `<!-- block: NAME -->` line; untagged
blocks fail the suite instead of being skipped. Words after the language are tags:

  jax-0.6-only   runs on jax 0.6.0 only (pmap_compat, legacy jax.pmap)
  two-envs       a shell block that names both environments itself; runs once
  multiprocess   also runs as 2 processes x 4 CPU devices over gloo, on both lines

On jax 0.6.0 Python blocks run in this process (8 CPU devices from conftest), each in
a fresh namespace; on jax 0.10.2 they run together in one interpreter of that
environment (tests/guide/run_blocks.py). Shell blocks run under `bash -euo pipefail`
from the repository root with the environment's python first on PATH. The blocks
check themselves against jax.pmap (or legacy recordings) on the JAX they run on.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from support import venvs
from support.multiprocess_jobs import reserved_port

# This module drives every JAX line itself (0.6.0 in-process, the others through their
# environments), so the in-process run on jax 0.10.2 has nothing to add.
pytestmark = pytest.mark.jax06_only(reason="runs the guide on every JAX line from jax 0.6.0")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(ROOT, "migration_guide.md")
BENCHMARKS = os.path.join(ROOT, "docs", "benchmarks.md")
RUN_BLOCKS = os.path.join(ROOT, "tests", "guide", "run_blocks.py")
LINE_FACTS = os.path.join(ROOT, "tests", "guide", "jax_line_facts.py")
TAGGED = re.compile(r"<!-- block: ([\w-]+) -->\n```(python|sh)([^\n]*)\n(.*?)\n```", re.S)
FENCE = re.compile(r"^```(python|sh)\b", re.M)
TAGS = {"jax-0.6-only", "two-envs", "multiprocess"}
NEW = venvs.NEWEST

# Blocks that need a project piece which does not work yet: strict, so they fail
# (XPASS) as soon as the piece lands and the entry must be deleted.
XFAIL: dict[str, str] = {}


@dataclasses.dataclass(frozen=True)
class Block:
  name: str
  lang: str
  tags: frozenset[str]
  code: str

  def runs_on(self, version: str) -> bool:
    if "two-envs" in self.tags:
      return version == "0.6.0"
    return version == "0.6.0" or "jax-0.6-only" not in self.tags


def _guide() -> str:
  with open(GUIDE, encoding="utf-8") as f:
    return f.read()


def tagged_blocks(text: str) -> list[Block]:
  """The tagged code blocks of a markdown text, in order."""
  return [Block(name, lang, frozenset(tags.split()), code)
          for name, lang, tags, code in TAGGED.findall(text)]


def _blocks() -> list[Block]:
  return tagged_blocks(_guide())


def _params(version: str):
  for b in _blocks():
    if b.runs_on(version):
      marks = [pytest.mark.xfail(strict=True, reason=XFAIL[b.name])] if b.name in XFAIL else []
      yield pytest.param(b, id=b.name, marks=marks)


def test_every_code_block_is_tagged_and_unique():
  blocks = _blocks()
  assert len(FENCE.findall(_guide())) == len(blocks), (
      "every ```python / ```sh block in migration_guide.md needs a `<!-- block: NAME -->` line")
  names = [b.name for b in blocks]
  assert len(set(names)) == len(names), f"duplicate block names: {names}"
  assert set(XFAIL) <= set(names), f"XFAIL names blocks that do not exist: {set(XFAIL) - set(names)}"
  unknown = {b.name: sorted(b.tags - TAGS) for b in blocks if b.tags - TAGS}
  assert not unknown, f"unknown block tags (known: {sorted(TAGS)}): {unknown}"


def test_guide_has_no_unfilled_placeholders():
  assert "_PLACEHOLDER" not in _guide()


def _run_shell(code: str, python: str) -> None:
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
  env.pop("PYTHONPATH", None)
  env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8",
             PATH=os.path.dirname(python) + os.pathsep + os.environ.get("PATH", ""))
  r = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=300, check=False)
  assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def run_block_here(block: Block, document: str, module: str) -> None:
  """Runs a block of `document` in this interpreter (jax 0.6.0): shell blocks with its
  python first on PATH, Python blocks in a fresh namespace named `module`."""
  if block.lang == "sh":
    _run_shell(block.code, sys.executable)
    return
  exec(compile(block.code, f"{document}:{block.name}", "exec"),  # pylint: disable=exec-used
       {"__name__": module})


@pytest.mark.parametrize("block", list(_params("0.6.0")))
def test_guide_block_runs_on_jax_0_6_0(block: Block):
  run_block_here(block, "migration_guide.md", "__guide__")


def _run_blocks_job(version: str, blocks: list[Block], out_dir: str, processes: int
                    ) -> list[dict[str, str]]:
  """Runs the Python blocks in `processes` interpreters of `version`; one result map each."""
  os.makedirs(out_dir, exist_ok=True)
  spec = os.path.join(out_dir, "blocks.json")
  with open(spec, "w", encoding="utf-8") as f:
    json.dump([{"name": b.name, "code": b.code} for b in blocks], f)
  python = venvs.python_for(version) if version != "0.6.0" else venvs.current_python()
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
  env.pop("PYTHONPATH", None)
  env.update(JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={8 // processes}")
  results = [os.path.join(out_dir, f"results_{i}.json") for i in range(processes)]
  commands = [[python, "-W", "error::DeprecationWarning", RUN_BLOCKS, spec, path] for path in results]
  with contextlib.ExitStack() as job:
    if processes > 1:
      # Reserved for the whole job, so no concurrent job can start a coordinator on it.
      port = job.enter_context(reserved_port())
      commands = [cmd + ["--distributed", f"127.0.0.1:{port}", str(i), str(processes)]
                  for i, cmd in enumerate(commands)]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for cmd in commands]
    try:
      outs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
      for p in procs:
        if p.poll() is None:
          p.kill()
  for p, out, path in zip(procs, outs, results, strict=True):
    assert p.returncode == 0 and os.path.exists(path), f"exit {p.returncode}\n{out[-3000:]}"
  loaded = []
  for path in results:
    with open(path, encoding="utf-8") as f:
      loaded.append(json.load(f))
  return loaded


@pytest.fixture(scope="session")
def new_jax_results(tmp_path_factory) -> dict[str, str]:
  """Every Python block that runs on the newest line, run once per test session.

  Under xdist the workers share the run's temp root, so the first one runs the job
  (under a file lock) and the others read its results.
  """
  base = tmp_path_factory.getbasetemp()
  root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
  out_dir = os.path.join(root, f"guide-blocks-jax{NEW}")
  os.makedirs(out_dir, exist_ok=True)
  done = os.path.join(out_dir, "results_0.json")
  with open(os.path.join(out_dir, "lock"), "w", encoding="utf-8") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not os.path.exists(done):
      blocks = [b for b in _blocks() if b.lang == "python" and b.runs_on(NEW)]
      _run_blocks_job(NEW, blocks, out_dir, processes=1)
  with open(done, encoding="utf-8") as f:
    return json.load(f)


@pytest.mark.parametrize("block", list(_params(NEW)))
def test_guide_block_runs_on_newest_jax(block: Block, new_jax_results: dict[str, str]):
  if block.lang == "sh":
    _run_shell(block.code, venvs.python_for(NEW))
    return
  assert new_jax_results[block.name] == "ok", new_jax_results[block.name]


@pytest.mark.multiprocess
@pytest.mark.parametrize("version", ["0.6.0", NEW])
def test_multiprocess_blocks_run_unchanged_as_two_processes(version: str, tmp_path):
  """The guide says its multi-host blocks run unchanged, one process per host: check it."""
  blocks = [b for b in _blocks() if "multiprocess" in b.tags and b.runs_on(version)]
  assert blocks, "the guide has no multiprocess blocks"
  for i, results in enumerate(_run_blocks_job(version, blocks, str(tmp_path), processes=2)):
    failed = {name: tb for name, tb in results.items() if tb != "ok"}
    assert not failed, f"process {i}: " + "\n".join(f"{n}:\n{tb}" for n, tb in failed.items())
    assert set(results) == {b.name for b in blocks}


def test_every_test_the_guide_names_exists():
  """`file.py::test_name` (and `::test_name` after it on the same line) must be real tests."""
  defined: dict[str, set[str]] = {}
  for dirpath, _, files in os.walk(os.path.join(ROOT, "tests")):
    for f in files:
      if f.startswith("test_") and f.endswith(".py"):
        with open(os.path.join(dirpath, f), encoding="utf-8") as src:
          defined.setdefault(f, set()).update(re.findall(r"^def (test_\w+)", src.read(), re.M))
  named = []
  for line in _guide().splitlines():
    current = None
    for file, name in re.findall(r"`(test_\w+\.py)?::(test_\w+)", line):
      current = file or current
      named.append((current, name))
  assert named, "the guide names no tests"
  missing = [f"{f}::{n}" for f, n in named if n not in defined.get(f, set())]
  assert not missing, f"the guide names tests that do not exist: {missing}"


def _table_rows(text: str, header_start: str) -> list[str]:
  """The lines of the markdown table whose header line starts with `header_start`."""
  lines = text.splitlines()
  starts = [i for i, line in enumerate(lines) if line.startswith(header_start)]
  assert len(starts) == 1, f"expected one table starting {header_start!r}, found {len(starts)}"
  rows = []
  for line in lines[starts[0]:]:
    if not line.startswith("|"):
      break
    rows.append(line)
  return rows


def _tables_rows(text: str, header_start: str) -> list[str]:
  """The lines of every markdown table whose header line starts with `header_start`."""
  lines = text.splitlines()
  rows = []
  for start in [i for i, line in enumerate(lines) if line.startswith(header_start)]:
    for line in lines[start:]:
      if not line.startswith("|"):
        break
      rows.append(line)
  assert rows, f"no table starting {header_start!r}"
  return rows


def test_performance_numbers_are_the_benchmark_pages():
  """The guide's performance table is rows of the benchmarks page's dispatch table,
  verbatim, and every measured figure its prose quotes is in that page's tables (jax
  0.6.0's and 0.10.2's)."""
  with open(BENCHMARKS, encoding="utf-8") as f:
    page = f.read()
  header = "| case | legacy | ours |"
  page_rows = _tables_rows(page, header) + _tables_rows(page, "| case | jax.pmap | ours |")
  guide_rows = _table_rows(_guide(), header)
  assert len(guide_rows) > 2
  stale = [row for row in guide_rows if row not in set(page_rows)]
  assert not stale, f"guide rows not in docs/benchmarks.md's dispatch table: {stale}"
  section = _guide().split("### Performance after migration", 1)[1].split("\n## ", 1)[0]
  measured = set(re.findall(r"(?<![\d.])\d+\.\d+(?![\d.×])", "\n".join(page_rows)))
  quoted = set(re.findall(r"(?<![\d.])\d+\.\d+(?![\d.×])", section))
  assert quoted, "the performance section quotes no figures"
  unknown = sorted(quoted - measured)
  assert not unknown, f"figures in the guide's performance section not in docs/benchmarks.md: {unknown}"


MATRIX_HEADER = "| | 0.4.35 | 0.4.38 |"


def _cells(row: str) -> list[str]:
  return [cell.strip() for cell in row.strip().strip("|").split("|")]


def test_version_matrix_is_what_each_environment_measures(tmp_path):
  """Every matrix cell that tests/guide/jax_line_facts.py can probe starts with what it
  measures in the environment of its column's release (every column is a release the
  project builds an environment for: tests/support/venvs.py RELEASES)."""
  rows = _table_rows(_guide(), MATRIX_HEADER)
  columns = _cells(rows[0])
  by_label = {_cells(row)[0]: dict(zip(columns, _cells(row), strict=True)) for row in rows[2:]}
  versions = columns[1:]
  assert set(versions) <= set(venvs.RELEASES), (
      f"matrix columns without a project environment: {set(versions) - set(venvs.RELEASES)}")
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
  env.pop("PYTHONPATH", None)
  env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8")
  outs = {v: str(tmp_path / f"{v}.json") for v in versions}
  wrong = []
  for batch in range(0, len(versions), 4):  # a few interpreters at a time
    chunk = versions[batch:batch + 4]
    procs = [subprocess.Popen([venvs.python_for(v), "-W", "error::DeprecationWarning",
                               LINE_FACTS, outs[v]], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for v in chunk]
    logs = [p.communicate(timeout=240)[0] for p in procs]
    for version, proc, log in zip(chunk, procs, logs, strict=True):
      assert proc.returncode == 0, f"jax {version}: exit {proc.returncode}\n{log[-3000:]}"
      with open(outs[version], encoding="utf-8") as f:
        measured = json.load(f)
      assert measured["jax"] == version
      assert set(measured["facts"]) <= set(by_label), (
          f"facts for rows the matrix lacks: {set(measured['facts']) - set(by_label)}")
      wrong += [f"{label} on {version}: the cell says {by_label[label][version]!r}, "
                f"measured {fact!r}" for label, fact in measured["facts"].items()
                if not by_label[label][version].startswith(fact)]
  assert not wrong, "\n".join(wrong)


EXAMPLE_ROWS = {  # matrix row -> the tools/release_matrix.py ways its cell reports
    "the examples as written, on that `jax.pmap`, vs the 0.6.0 recording": ("pmap",),
    "the examples under `pmap_compat.patched()`, vs the 0.6.0 recording": ("pmap_compat",),
    "codemod output `--target experimental` / `--target jax`, vs the recording":
        ("codemod-experimental", "codemod-jax"),
}


def _example_cell_start(result: dict) -> str:
  """How a cell starts for one way on one release: ``N of 10``; what every failure was
  when nothing passed (``fails at import``, ``DeprecationWarning``)."""
  if not result["passed"]:
    reasons = set(result["failed"].values())
    if all(r.startswith("ImportError") for r in reasons):
      return "fails at import"
    if all(r.startswith("DeprecationWarning") for r in reasons):
      return "`DeprecationWarning`"
  return f"{len(result['passed'])} of {result['examples']}"


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory) -> str:
  """One work directory for every release's runs: legacy's recording is made once."""
  return str(tmp_path_factory.mktemp("release_matrix"))


@pytest.mark.slow
@pytest.mark.parametrize("version", [v for v in venvs.RELEASES if v != venvs.LEGACY])
def test_version_matrix_example_cells_are_what_each_release_measures(version, example_runs):
  """The example rows' cells start with what tools/release_matrix.py measures on that
  release: how many examples pass each way, vs legacy's recording on 0.6.0."""
  sys.path.insert(0, os.path.join(ROOT, "tools"))
  import release_matrix  # pylint: disable=import-outside-toplevel
  rows = _table_rows(_guide(), MATRIX_HEADER)
  columns = _cells(rows[0])
  by_label = {_cells(row)[0]: dict(zip(columns, _cells(row), strict=True)) for row in rows[2:]}
  found = release_matrix.measure([version], example_runs)[version]
  wrong = []
  for label, ways in EXAMPLE_ROWS.items():
    cell = by_label[label][version]
    parts = cell.split(" / ") if len(ways) > 1 else [cell]
    for way, part in zip(ways, parts, strict=False):
      if way == "codemod-jax" and part.startswith("—"):
        continue  # no jax.shard_map: the cell says so; the tool ran an adapter
      expected = _example_cell_start(found[way])
      if not part.startswith(expected):
        wrong.append(f"{label}, {way}: the cell says {part!r}, measured {expected}: "
                     f"{found[way]['failed']}")
  assert not wrong, "\n".join(wrong)


def test_the_version_matrix_is_only_the_guides():
  """The guide holds the one version matrix (its cells are the ones measured above); the
  README, CONTRIBUTING and the docs pages link to it instead of copying rows."""
  others = [os.path.join(ROOT, "README.md"), os.path.join(ROOT, "CONTRIBUTING.md"),
            *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
  copies = []
  for path in others:
    with open(path, encoding="utf-8") as f:
      if MATRIX_HEADER in f.read():
        copies.append(os.path.relpath(path, ROOT))
  assert len(_table_rows(_guide(), MATRIX_HEADER)) > 2
  assert not copies, f"copies of the version matrix (link to the guide's instead): {copies}"


def _github_anchor(heading: str) -> str:
  """The id GitHub gives a markdown heading: lowercase, punctuation dropped, spaces to -."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_guide_links_to_its_own_sections_resolve():
  text = _guide()
  anchors = {_github_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}
  links = re.findall(r"\]\(#([^)]+)\)", text)
  assert links, "the guide links to none of its sections"
  broken = sorted(set(links) - anchors)
  assert not broken, f"links to sections that do not exist: {broken}"
