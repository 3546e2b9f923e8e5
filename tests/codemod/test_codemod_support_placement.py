"""Where the support module goes, proved where the converted code runs.

Code inside a package imports a copy that ships with the package (``mypkg/_pmap_shard_map.py``):
the converted package is built into a wheel, installed into a throwaway environment and
imported from outside the source tree. A notebook gets the support functions it uses as a
cell of its own: the converted notebook runs with no project file next to it. Both are
compared with the unconverted code under legacy ``jax.pmap`` (jax 0.6.0)."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import sysconfig
import textwrap
import zipfile

from codemod import notebook_support, pmap_to_shmap, support_module

ENV = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}

# jax 0.6.0 runs the codemod here and the trees declare no jax: copies keep the code a
# shard_map before 0.7.2 needs.
BEFORE_0_7_2 = support_module.SHARD_MAP_BEFORE_0_7_2

OPS = '''\
import jax
import numpy as np


def double(x):
  return jax.pmap(lambda v: v * 2, axis_name="i")(x)


def total(x):
  return jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")(x)
'''
RELATIVE = '''\
import jax

from . import ops


def scaled(x, scale):
  step = jax.pmap(lambda v, s: v * s, in_axes=(0, None))
  return ops.double(step(x, scale))
'''
RUN = '''\
import json
import numpy as np
import mypkg.parallel.ops as ops
import mypkg.parallel.relative as relative

x = np.arange(12, dtype=np.float32).reshape(4, 3)
print(json.dumps({"file": ops.__file__, "double": ops.double(x).tolist(),
                  "total": ops.total(x).tolist(),
                  "scaled": relative.scaled(x, np.float32(3)).tolist()}))
'''


def _package(root: pathlib.Path) -> pathlib.Path:
  (root / "mypkg" / "parallel").mkdir(parents=True)
  (root / "mypkg" / "__init__.py").write_text('"""A library with pmap sites."""\n')
  (root / "mypkg" / "parallel" / "__init__.py").write_text("")
  (root / "mypkg" / "parallel" / "ops.py").write_text(OPS)
  (root / "mypkg" / "parallel" / "relative.py").write_text(RELATIVE)
  return root


def _run(args: list[str], cwd: pathlib.Path, **env: str) -> subprocess.CompletedProcess:
  full = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  full.update(ENV, **env)
  return subprocess.run(args, cwd=cwd, env=full, capture_output=True, text=True, timeout=300,
                        check=False)


def _wheel(source: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
  """A wheel of every file of the ``mypkg`` package under ``source``, as a build backend's
  package discovery would ship it (setuptools' find_packages: the package's .py files)."""
  name = "mypkg-0.1-py3-none-any.whl"
  dist = "mypkg-0.1.dist-info"
  entries = {str(p.relative_to(source)): p.read_bytes()
             for p in sorted((source / "mypkg").rglob("*.py"))}
  entries[f"{dist}/METADATA"] = b"Metadata-Version: 2.1\nName: mypkg\nVersion: 0.1\n"
  entries[f"{dist}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n")
  record = []
  for path, data in entries.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{path},sha256={digest},{len(data)}")
  record.append(f"{dist}/RECORD,,")
  entries[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
  with zipfile.ZipFile(out / name, "w") as wheel:
    for path, data in entries.items():
      wheel.writestr(path, data)
  return out / name


def test_package_support_ships_in_the_installed_wheel(tmp_path):
  legacy_tree = _package(tmp_path / "legacy")
  tree = _package(tmp_path / "converted")
  assert pmap_to_shmap.main(["--in-place", "--target", "experimental", str(tree)]) == 0
  ops = (tree / "mypkg" / "parallel" / "ops.py").read_text()
  relative = (tree / "mypkg" / "parallel" / "relative.py").read_text()
  # Inside the package, imported as each file imports its own package.
  # (ops.py calls its sites where it makes them: their meshes span pmap_devices(x))
  assert "from mypkg._pmap_shard_map import per_device, placed_on, pmap_devices\n" in ops
  assert "from .._pmap_shard_map import per_device, placed_on\n" in relative
  # With just what the package's files call.
  assert (tree / "mypkg" / "_pmap_shard_map.py").read_text() == support_module.source(
      {"per_device", "placed_on", "pmap_devices", BEFORE_0_7_2})
  assert not (tree / "pmap_shard_map.py").exists()

  # Installed from a wheel into a throwaway environment that sees .venv's packages.
  venv = tmp_path / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                 timeout=120)
  python = venv / "bin" / "python"
  site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
              tmp_path).stdout.strip()
  pathlib.Path(site, "outer_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
  wheel = _wheel(tree, tmp_path)
  install = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                  "--no-index", "--quiet", str(wheel)], tmp_path)
  assert install.returncode == 0, install.stderr
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  converted = _run([str(python), "-I", "-c", RUN], elsewhere)
  assert converted.returncode == 0, converted.stderr
  got = json.loads(converted.stdout)
  assert got.pop("file").startswith(site)  # the installed copy, not the source tree
  legacy = _run([sys.executable, "-c", RUN], elsewhere, PYTHONPATH=str(legacy_tree))
  assert legacy.returncode == 0, legacy.stderr
  expected = json.loads(legacy.stdout)
  expected.pop("file")
  assert got == expected


def test_package_detection(tmp_path):
  (tmp_path / "proj" / "src" / "nspkg" / "sub").mkdir(parents=True)
  (tmp_path / "proj" / "pyproject.toml").write_text("[project]\nname = 'nspkg'\n")
  namespaced = tmp_path / "proj" / "src" / "nspkg" / "sub" / "m.py"
  assert support_module.package_of(str(namespaced)) == (str(tmp_path / "proj" / "src"),
                                                        ["nspkg", "sub"])
  place = support_module.placement(str(namespaced), "from . import x\n")
  assert (place.name, place.spelling) == ("nspkg._pmap_shard_map", ".._pmap_shard_map")
  # A src/ directory that is not a project's (say ~/src/repo/scripts) is no package.
  (tmp_path / "src" / "repo" / "scripts").mkdir(parents=True)
  script = tmp_path / "src" / "repo" / "scripts" / "train.py"
  assert support_module.package_of(str(script)) is None
  # A script imports a copy next to it: Python puts the script's directory on sys.path.
  assert support_module.placement(str(script), "") == support_module.Placement(
      str(script.parent), "pmap_shard_map", "pmap_shard_map")


def test_scripts_outside_packages_get_a_copy_next_to_them(tmp_path, capsys):
  (tmp_path / "scripts").mkdir()
  (tmp_path / "scripts" / "train.py").write_text(OPS)
  _package(tmp_path)
  assert pmap_to_shmap.main(["--in-place", "--target", "experimental", str(tmp_path)]) == 0
  assert "from pmap_shard_map import per_device, placed_on, pmap_devices" in (
      tmp_path / "scripts" / "train.py").read_text()
  used = support_module.source({"per_device", "placed_on", "pmap_devices", BEFORE_0_7_2})
  assert (tmp_path / "scripts" / "pmap_shard_map.py").read_text() == used
  assert not (tmp_path / "pmap_shard_map.py").exists()
  assert (tmp_path / "mypkg" / "_pmap_shard_map.py").read_text() == used
  err = capsys.readouterr().err
  assert "INFO support module mypkg._pmap_shard_map written" in err
  assert "INFO support module pmap_shard_map written" in err
  assert pmap_to_shmap.main(["--check", str(tmp_path)]) == 0


EXAMPLE = '''\
import json

from examples.imagenet import dataset
import jax
import numpy as np

if __name__ == "__main__":
  step = jax.pmap(lambda v: jax.lax.psum(v, "i") * dataset.SCALE, axis_name="i")
  print(json.dumps(step(np.arange(12, dtype=np.float32).reshape(4, 3)).tolist()))
'''


def test_an_example_imports_the_support_module_the_way_it_imports_its_package(tmp_path):
  # haiku's examples/imagenet: a package below a directory that is none, whose train.py
  # imports its package through that directory, run from the repository's root.
  (tmp_path / "examples" / "imagenet").mkdir(parents=True)
  (tmp_path / "examples" / "imagenet" / "__init__.py").write_text("")
  (tmp_path / "examples" / "imagenet" / "dataset.py").write_text("SCALE = 2\n")
  (tmp_path / "examples" / "imagenet" / "train.py").write_text(EXAMPLE)
  command = [sys.executable, "-m", "examples.imagenet.train"]
  legacy = _run(command, tmp_path)
  assert legacy.returncode == 0, legacy.stderr
  assert pmap_to_shmap.main(["--in-place", "--target", "experimental", str(tmp_path)]) == 0
  converted = (tmp_path / "examples" / "imagenet" / "train.py").read_text()
  assert "from examples.imagenet._pmap_shard_map import " in converted
  assert (tmp_path / "examples" / "imagenet" / "_pmap_shard_map.py").is_file()
  ours = _run(command, tmp_path)
  assert ours.returncode == 0, ours.stderr
  assert json.loads(ours.stdout) == json.loads(legacy.stdout)


def test_a_namespace_package_module_imports_the_support_module_as_others_import_it(tmp_path):
  # paxml ships no __init__.py: base_metrics.py imports nothing of paxml itself, but its
  # users import it as paxml.base_metrics, so the support module is paxml.pmap_shard_map.
  (tmp_path / ".git").mkdir()
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "metrics.py").write_text(
      "import jax\n\nstep = jax.pmap(lambda v: jax.lax.psum(v, 'i') * 2, axis_name='i')\n")
  (tmp_path / "pkg" / "report.py").write_text(
      "import json\n\nimport numpy as np\n\nfrom pkg import metrics\n\n"
      "print(json.dumps(metrics.step(np.arange(12.0).reshape(4, 3)).tolist()))\n")
  (tmp_path / "pkg" / "tool.py").write_text(
      "import json\n\nimport jax\nimport numpy as np\n\nif __name__ == '__main__':\n"
      "  print(json.dumps(jax.pmap(lambda v: v + 1)(np.full(4, 2.0)).tolist()))\n")
  command = [sys.executable, "-m", "pkg.report"]
  legacy = _run(command, tmp_path)
  assert legacy.returncode == 0, legacy.stderr
  assert pmap_to_shmap.main(["--in-place", "--target", "experimental", str(tmp_path)]) == 0
  converted = (tmp_path / "pkg" / "metrics.py").read_text()
  assert "from pkg.pmap_shard_map import " in converted
  assert "on_first_call" in converted  # imported by others: no devices asked at import
  ours = _run(command, tmp_path)
  assert ours.returncode == 0, ours.stderr
  assert json.loads(ours.stdout) == json.loads(legacy.stdout)
  # A script there, run as `python pkg/tool.py`, finds the module next to it.
  assert "from pmap_shard_map import " in (tmp_path / "pkg" / "tool.py").read_text()
  script = _run([sys.executable, str(tmp_path / "pkg" / "tool.py")], tmp_path)
  assert script.returncode == 0 and json.loads(script.stdout) == [3.0] * 4, script.stderr


def test_a_script_directory_imported_under_another_layout_keeps_its_own_copy(tmp_path):
  # flax's examples/imagenet: its files import each other bare (`import models`); a
  # benchmark imports it as flax.examples.imagenet, through the repository's own
  # directory name (a layout outside the repository). The scripts keep the copy beside
  # them, which `python main.py` there finds.
  root = tmp_path / "proj"
  (root / ".git").mkdir(parents=True)
  (root / "examples" / "img").mkdir(parents=True)
  (root / "examples" / "img" / "models.py").write_text("SCALE = 3\n")
  (root / "examples" / "img" / "train.py").write_text(
      "import jax\n\nimport models\n\n"
      "step = jax.pmap(lambda v: v * models.SCALE, axis_name='batch')\n")
  (root / "bench").mkdir()
  (root / "bench" / "img.py").write_text("from proj.examples.img import models\n")
  assert pmap_to_shmap.main(["--in-place", "--target", "experimental", str(root)]) == 0
  train = (root / "examples" / "img" / "train.py").read_text()
  assert "from pmap_shard_map import " in train, train
  run = _run([sys.executable, "-c", "import json, numpy as np, train; "
              "print(json.dumps(train.step(np.ones(4)).tolist()))"], root / "examples" / "img")
  assert run.returncode == 0 and json.loads(run.stdout) == [3.0] * 4, run.stderr


def test_tests_and_namespace_directories_of_the_package_use_the_package_s_copy(tmp_path):
  # kfac-jax's tests/ (no __init__.py) import kfac_jax: they got a second copy of the
  # support module beside them; they import the package's own.
  (tmp_path / ".git").mkdir()
  (tmp_path / "mypkg").mkdir()
  (tmp_path / "mypkg" / "__init__.py").write_text("")
  (tmp_path / "mypkg" / "ops.py").write_text(
      "import jax\n\n\ndef double(x):\n  return jax.pmap(lambda v: v * 2)(x)\n")
  (tmp_path / "tests").mkdir()
  (tmp_path / "tests" / "ops_test.py").write_text(
      "import jax\nimport numpy as np\n\nfrom mypkg import ops\n\n\ndef test_double():\n"
      "  x = np.ones((jax.device_count(), 2))\n"
      "  assert (jax.pmap(lambda v: v / 2)(ops.double(x)) == x).all()\n")
  # jraph/experimental: a directory without __init__.py in the package's tree
  (tmp_path / "mypkg" / "experimental").mkdir()
  (tmp_path / "mypkg" / "experimental" / "halves.py").write_text(
      "import jax\nimport numpy as np\n\nimport mypkg\n\n"
      "print(jax.pmap(lambda v: v / 2)(np.ones(jax.device_count())).tolist())\n")
  (tmp_path / "scripts").mkdir()
  (tmp_path / "scripts" / "run.py").write_text(
      "import jax\nimport numpy as np\n\nimport mypkg\n\n"
      "print(jax.pmap(lambda v: v + 1)(np.ones(jax.device_count())))\n")
  assert pmap_to_shmap.main(["--in-place", "--target", "experimental", str(tmp_path)]) == 0
  test = (tmp_path / "tests" / "ops_test.py").read_text()
  assert "from mypkg._pmap_shard_map import per_device, placed_on" in test
  assert not (tmp_path / "tests" / "pmap_shard_map.py").exists()
  assert (tmp_path / "scripts" / "pmap_shard_map.py").exists()  # a script: its own copy
  assert "from mypkg._pmap_shard_map import " in (
      tmp_path / "mypkg" / "experimental" / "halves.py").read_text()
  assert not (tmp_path / "mypkg" / "experimental" / "pmap_shard_map.py").exists()
  halves = _run([sys.executable, "-m", "mypkg.experimental.halves"], tmp_path)
  assert halves.returncode == 0 and json.loads(halves.stdout) == [0.5] * 4, halves.stderr
  run = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
              "tests/ops_test.py"], tmp_path, PYTHONPATH=str(tmp_path))
  assert run.returncode == 0, run.stdout + run.stderr


def test_explicit_support_module_is_used_by_every_file(tmp_path):
  tree = _package(tmp_path / "tree")
  assert pmap_to_shmap.main(["--in-place", "--target", "experimental", "--support-module",
                             "shared_support", str(tree)]) == 0
  assert "from shared_support import per_device, placed_on" in (
      tree / "mypkg" / "parallel" / "relative.py").read_text()
  assert (tree / "shared_support.py").exists()
  assert not (tree / "mypkg" / "_pmap_shard_map.py").exists()


def test_foreign_file_where_the_package_copy_goes_is_never_overwritten(tmp_path, capsys):
  tree = _package(tmp_path)
  (tree / "mypkg" / "_pmap_shard_map.py").write_text("# mine\n")
  assert pmap_to_shmap.main(["--in-place", str(tree)]) == pmap_to_shmap.EXIT_INTERNAL_ERROR
  assert "not written by pmap-to-shmap" in capsys.readouterr().err
  assert (tree / "mypkg" / "parallel" / "ops.py").read_text() == OPS


# ----- notebooks -----

def _cell(source: str) -> dict:
  return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
          "source": source.splitlines(keepends=True)}


NOTEBOOK_CELLS = [
    "example_directory = 'examples/demo'\n",  # a setup cell before the imports
    "import json\nimport jax\nimport numpy as np\n",
    "x = np.arange(12, dtype=np.float32).reshape(4, 3)\n"
    "double = jax.pmap(lambda v: v * 2, axis_name='i')\n"
    "def run(axes):\n"
    "  return jax.pmap(lambda v, s: jax.lax.psum(v * s, 'i'), 'i', in_axes=axes)(x, 2.0)\n",
    "result = {'double': double(x).tolist(), 'total': run((0, None)).tolist()}\n",
]
EXECUTE = '''\
import json, os, sys
sys.path.insert(0, os.getcwd())  # as a notebook kernel started in the notebook's directory
namespace = {"__name__": "__main__"}
for cell in json.load(open(sys.argv[1]))["cells"]:
  if cell["cell_type"] == "code":
    exec(compile("".join(cell["source"]), "<cell>", "exec"), namespace)
print(json.dumps(namespace["result"]))
'''


def _execute(path: pathlib.Path, where: pathlib.Path) -> dict:
  """Runs the notebook's code cells in order in a fresh interpreter whose working
  directory is ``where`` (isolated: PYTHONPATH and the caller's directory aside)."""
  run = _run([sys.executable, "-I", "-c", EXECUTE, str(path)], where)
  assert run.returncode == 0, run.stderr
  return json.loads(run.stdout)


def test_converted_notebook_runs_from_its_directory_as_legacy_did(tmp_path):
  nb = {"cells": [_cell(c) for c in NOTEBOOK_CELLS], "metadata": {}, "nbformat": 4,
        "nbformat_minor": 5}
  legacy = tmp_path / "legacy"
  legacy.mkdir()
  original = legacy / "demo.ipynb"
  original.write_text(json.dumps(nb, indent=1))
  path = tmp_path / "demo.ipynb"
  path.write_text(json.dumps(nb, indent=1))
  assert pmap_to_shmap.main(["--in-place", "--target", "experimental", str(path)]) == 0
  # The support module goes next to the notebook, holding just what it calls; the setup
  # cell is untouched, and the new imports, the support module's too, went to the import
  # cell: a converted notebook adds one import line for it, no support cell.
  assert sorted(os.listdir(tmp_path)) == ["demo.ipynb", "legacy", "pmap_shard_map.py"]
  held = support_module.held((tmp_path / "pmap_shard_map.py").read_text().partition("\n")[2])
  # double is a plain site; run's axes are known only at run time (pmap_via_shard_map).
  assert held >= {"per_device", "placed_on", "pmap_via_shard_map"}
  assert "first_row" not in held and "device_put_replicated" not in held
  cells = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]]
  assert len(cells) == len(NOTEBOOK_CELLS) and cells[0] == NOTEBOOK_CELLS[0]
  assert cells[1].startswith(NOTEBOOK_CELLS[1])
  assert "from jax.sharding import" in cells[1]
  assert cells[1].rstrip().endswith(
      "from pmap_shard_map import per_device, placed_on, pmap_via_shard_map"), cells[1]
  assert "jax.pmap" not in cells[2]
  assert _execute(path, tmp_path) == _execute(original, legacy)
  # A second run leaves it alone.
  before = path.read_bytes()
  assert pmap_to_shmap.main(["--in-place", "--target", "experimental", str(path)]) == 0
  assert path.read_bytes() == before


def test_a_support_cell_from_an_earlier_run_is_kept_and_grows(tmp_path):
  # Notebooks converted before the support module went next to them hold its code in a
  # cell: a rerun keeps calling that, and grows it when it converts more.
  path = tmp_path / "grow.ipynb"
  cell = notebook_support.source(("per_device", "placed_on"), {"import jax"}, {"import jax"})
  first = ["import jax\n", cell, "f = jax.pmap(lambda v: v + 1)\n"]
  path.write_text(json.dumps({"cells": [_cell(c) for c in first], "metadata": {},
                              "nbformat": 4, "nbformat_minor": 5}, indent=1))
  assert pmap_to_shmap.main(["--in-place", "--target", "experimental", str(path)]) == 0
  nb = json.loads(path.read_text())
  assert notebook_support.names_in("".join(nb["cells"][1]["source"])) == (
      "per_device", "placed_on")
  nb["cells"].append(_cell("def g(axes):\n  return jax.pmap(lambda v: v, in_axes=axes)\n"))
  path.write_text(json.dumps(nb, indent=1))
  assert pmap_to_shmap.main(["--in-place", "--target", "experimental", str(path)]) == 0
  cells = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"]]
  assert len(cells) == 4 and not (tmp_path / "pmap_shard_map.py").exists()
  assert "pmap_shard_map" not in "".join(cells)
  # g's axes are known only at run time: pmap_via_shard_map and its helpers join the cell.
  assert notebook_support.names_in(cells[1]) == (
      "per_device", "placed_on", "pmap_via_shard_map")
  assert "def pmap_via_shard_map" in cells[1] and "def on_pmap_mesh" not in cells[1]


def test_markdown_notebook_imports_the_module_next_to_it(tmp_path):
  text = textwrap.dedent("""\
      ---
      jupytext:
        text_representation:
          format_name: myst
      ---

      ```{code-cell} ipython3
      import jax
      ```

      Prose.

      ```{code-cell} ipython3
      step = jax.pmap(lambda x: x * 2, axis_name='d')
      ```
      """)
  path = tmp_path / "page.md"
  path.write_text(text)
  assert pmap_to_shmap.main(["--in-place", "--target", "experimental", str(path)]) == 0
  new = path.read_text()
  assert new.index("from pmap_shard_map import per_device, placed_on\n```") < new.index(
      "Prose.") < new.index("step = placed_on(mesh, P('d'))(")
  assert "Support code" not in new and (tmp_path / "pmap_shard_map.py").exists()
  assert pmap_to_shmap.main(["--check", str(path)]) == 0


def test_placement_is_planned_once_per_file_and_passed_on(tmp_path, monkeypatch):
  # The run plans where each file's support module goes before it converts anything; the
  # conversion and the writing of the modules use that plan, never a second decision.
  (tmp_path / ".git").mkdir()
  (tmp_path / "mypkg").mkdir()
  (tmp_path / "mypkg" / "__init__.py").write_text("")
  (tmp_path / "mypkg" / "ops.py").write_text(OPS)
  (tmp_path / "scripts").mkdir()
  (tmp_path / "scripts" / "run.py").write_text(
      "import jax\nimport numpy as np\n\n"
      "print(jax.pmap(lambda v: v + 1)(np.ones(jax.device_count())))\n")
  (tmp_path / "scripts" / "notes.py").write_text("x = 1\n")
  decided: list[str] = []
  plan = support_module.placement

  def counted(path, *args, **kwargs):
    decided.append(os.path.relpath(path, tmp_path))
    return plan(path, *args, **kwargs)

  monkeypatch.setattr(support_module, "placement", counted)
  assert pmap_to_shmap.main(["--in-place", "--target", "experimental", str(tmp_path)]) == 0
  assert sorted(decided) == sorted(
      ["mypkg/__init__.py", "mypkg/ops.py", "scripts/run.py", "scripts/notes.py"])
  assert "from mypkg._pmap_shard_map import per_device, placed_on" in (
      tmp_path / "mypkg" / "ops.py").read_text()
  assert (tmp_path / "mypkg" / "_pmap_shard_map.py").exists()
  assert (tmp_path / "scripts" / "pmap_shard_map.py").exists()
