"""The codemod adds no ruff F-finding: every fixture, example and notebook case is linted
(``ruff check --select F``) before and after the rewrite, and each finding of the output
must have been in the input (unused or duplicated imports are what a reviewer rejects:
F401 for a ``PartitionSpec as P`` nothing uses, F811 for an ``import jax`` put into a
notebook's setup cell above the notebook's own)."""
from __future__ import annotations

import collections
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from codemod import pmap_to_shmap
from codemod_testing import rewrite

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RUFF = os.path.join(os.path.dirname(sys.executable), "ruff")
FIXTURES = sorted(os.path.join(HERE, "fixtures", f) for f in os.listdir(
    os.path.join(HERE, "fixtures")) if f.endswith(".py"))
EXAMPLES = sorted(os.path.join(ROOT, "examples", f) for f in os.listdir(
    os.path.join(ROOT, "examples")) if f.endswith(".py"))

CASES = {
    # flax nnx/transforms/iteration.py: in_axes / out_axes given at run time, so no P(...)
    # is written; P must not be imported.
    "run_time_axes": '''\
import jax


def pmap(f, in_axes, out_axes, axis_name=None):
  return jax.pmap(f, axis_name=axis_name, in_axes=in_axes, out_axes=out_axes)
''',
    # jax under another name: the import that served `j.pmap` alone goes with it.
    "module_alias_plain": '''\
import jax as j

f = j.pmap(lambda x: x * 2, axis_name="i")
''',
    "module_alias_run_time_axes": '''\
import jax as j


def make(axes):
  return j.pmap(lambda x: x * 2, in_axes=axes)
''',
    # A site left unconverted next to a converted one: nothing is imported for it.
    "unconverted_site": '''\
import jax

f = jax.pmap(lambda x: x * 2)
g = jax.pmap(f, in_axis=0)  # no such argument: reported
''',
    # Nothing converted at all: nothing imported.
    "only_unconvertible": '''\
import jax

g = jax.pmap(f, in_axis=0)  # no such argument: reported
''',
    # The file imports jax and functools after a statement: not imported again above it.
    "imports_after_setup": '''\
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"

import functools
import jax


@functools.partial(jax.pmap, axis_name="i")
def f(x):
  return jax.lax.psum(x, "i")
''',
    # P and shard_map already imported, in a try block.
    "already_imported": '''\
import jax
try:
  from jax.sharding import PartitionSpec as P
  from jax.experimental.shard_map import shard_map
except ImportError:
  P = shard_map = None

f = jax.pmap(lambda x: x * 2, axis_name="i")
spec = P("i")
smap = shard_map
''',
    # The removed name imported as it is: with --target jax its calls use the support
    # module's function of that name, which must not redefine JAX's import (F811).
    "removed_name_imported": '''\
import jax
from jax import device_put_replicated, jit

step = jax.pmap(lambda s, x: (s, x * 2), axis_name="i")
state, x = step(device_put_replicated(1.0, jax.devices()), jit(lambda v: v)(2.0))
''',
}


def _f_findings(paths: list[pathlib.Path]) -> dict[str, collections.Counter]:
  """ruff's F-findings per file name, as (code, message with numbers masked) counts."""
  run = subprocess.run([RUFF, "check", "--isolated", "--no-cache", "--select", "F",
                        "--output-format", "json", *map(str, paths)],
                       capture_output=True, text=True, timeout=300, check=False)
  assert run.returncode in (0, 1), run.stderr
  out: dict[str, collections.Counter] = {p.name: collections.Counter() for p in paths}
  for finding in json.loads(run.stdout):
    name = os.path.basename(finding["filename"])
    out[name][(finding["code"], re.sub(r"\d+", "N", finding["message"]))] += 1
  return out


def _assert_no_new_findings(before: dict, after: dict) -> None:
  new = {name: after[name] - before[name] for name in after if after[name] - before[name]}
  assert not new, new


@pytest.mark.parametrize("options", [{"target": "experimental"}, {"target": "jax"},
                                     {"target": "experimental", "multihost": True}],
                         ids=["experimental", "jax", "multihost"])
def test_rewrite_adds_no_f_finding(tmp_path, options):
  sources = {os.path.basename(p): pathlib.Path(p).read_text() for p in FIXTURES + EXAMPLES}
  sources.update({f"{name}.py": text for name, text in CASES.items()})
  paths = {}
  for side in ("before", "after"):
    (tmp_path / side).mkdir()
    for name, text in sources.items():
      new = text if side == "before" else rewrite(text, **options)[0]
      (tmp_path / side / name).write_text(new)
      paths.setdefault(side, []).append(tmp_path / side / name)
  assert "import P" not in (tmp_path / "after" / "run_time_axes.py").read_text()
  assert (tmp_path / "after" / "only_unconvertible.py").read_text() == CASES[
      "only_unconvertible"]
  _assert_no_new_findings(_f_findings(paths["before"]), _f_findings(paths["after"]))


def _notebook(*cells: str) -> str:
  return json.dumps({"cells": [{"cell_type": "code", "execution_count": None, "metadata": {},
                                "outputs": [], "source": c.splitlines(keepends=True)}
                               for c in cells],
                     "metadata": {"language_info": {"name": "python"}}, "nbformat": 4,
                     "nbformat_minor": 5}, indent=1)


NOTEBOOKS = {
    # flax imagenet.ipynb: a setup cell (shell escape, paths) before the import cell.
    "setup_cell": _notebook(
        "!pip install -q clu\nexample_directory = 'examples/imagenet'\n",
        "import functools\nimport jax\nimport numpy as np\n",
        "p_step = jax.pmap(functools.partial(np.add, 1), axis_name='batch')\n"),
    # One cell imports and converts: the support module import joins its imports.
    "one_cell": _notebook(
        "import jax\nimport numpy as np\nf = jax.pmap(lambda x: x * 2)\n"
        "print(f(np.ones((jax.local_device_count(), 3))))\n"),
    # Run-time in_axes in a later cell, with numpy only imported in the site's cell.
    "run_time_axes": _notebook(
        "import jax\n",
        "import numpy as np\ndef run(axes):\n  return jax.pmap(np.add, in_axes=axes)\n"),
}


def test_notebook_rewrite_adds_no_f_finding(tmp_path):
  before, after = [], []
  for name, text in NOTEBOOKS.items():
    for side, paths in (("before", before), ("after", after)):
      path = tmp_path / side / f"{name}.ipynb"
      path.parent.mkdir(exist_ok=True)
      path.write_text(text)
      paths.append(path)
  assert pmap_to_shmap.main(["--in-place", "--target", "experimental",
                             str(tmp_path / "after")]) == 0
  setup = json.loads((tmp_path / "after" / "setup_cell.ipynb").read_text())["cells"]
  assert setup[0] == json.loads(NOTEBOOKS["setup_cell"])["cells"][0]  # the setup cell stays
  _assert_no_new_findings(_f_findings(before), _f_findings(after))
