"""The repository's configured import sorting decides where new imports go (ruff's
``[lint.isort]``, isort's settings and profiles), checked with ruff's own isort rule run
with the repository's configuration: a converted file that passed it still passes.

The files here are ambiguous on their own (no ``from`` import beside an ``import`` in one
section), so without the configuration the codemod would follow ruff's default order."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from codemod import import_style
from codemod import pmap_to_shmap  # noqa: F401  (the CLI the tests run)

RUFF = pathlib.Path(sys.executable).parent / "ruff"
SITE = '''\
import os

import jax
import numpy as np

import mylib


def f(x):
  return jax.lax.psum(x + mylib.one(), "i")


step = jax.pmap(f, axis_name="i")
'''
# isort's google profile as ruff options: what `ruff check --select I` enforces there.
GOOGLE_AS_RUFF = ("lint.isort.force-sort-within-sections = true",
                  "lint.isort.force-single-line = true")


def _convert(root: pathlib.Path) -> str:
  run = subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", str(root / "pkg"),
                        "--in-place"], capture_output=True, text=True, timeout=300,
                       check=False, cwd=pathlib.Path(__file__).resolve().parents[2])
  assert run.returncode == 0, run.stdout + run.stderr
  return (root / "pkg" / "train.py").read_text()


def _repository(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
  root = tmp_path / "repo"
  (root / ".git").mkdir(parents=True)
  (root / "pkg").mkdir()
  (root / "pkg" / "train.py").write_text(SITE)
  for name, text in files.items():
    (root / name).write_text(text)
  return root


def _ruff_isort(root: pathlib.Path, path: pathlib.Path, *options: str) -> subprocess.CompletedProcess:
  """ruff's I001 on ``path``: with the repository's own configuration, or, given
  ``options``, with just those (isolated: for a configuration only isort reads)."""
  args = [str(RUFF), "check", "--no-cache", "--select", "I001"]
  if options:
    args.append("--isolated")
    for option in options:
      args += ["--config", option]
  return subprocess.run([*args, str(path)], cwd=root, capture_output=True, text=True,
                        timeout=60, check=False)


RUFF_FORCE_SORT = '''\
[tool.ruff.lint]
select = ["I"]

[tool.ruff.lint.isort]
force-sort-within-sections = true
known-first-party = ["mylib"]
'''


def test_ruff_force_sort_within_sections_puts_from_imports_among_their_modules(tmp_path):
  root = _repository(tmp_path, {"pyproject.toml": RUFF_FORCE_SORT})
  train = root / "pkg" / "train.py"
  assert _ruff_isort(root, train).returncode == 0
  after = _convert(root)
  assert after.index("import jax\n") < after.index("from jax.sharding import PartitionSpec as P\n") \
      < after.index("import numpy as np\n")
  check = _ruff_isort(root, train)
  assert check.returncode == 0, check.stdout + "\n" + after


@pytest.mark.parametrize("config_file,text", [
    ("setup.cfg", "[isort]\nprofile = google\nknown_first_party = mylib\n"),
    (".isort.cfg", "[settings]\nprofile=google\nknown_first_party=mylib\n"),
    ("pyproject.toml", '[tool.isort]\nprofile = "google"\nknown_first_party = ["mylib"]\n'),
])
def test_isort_google_profile_sorts_together_one_name_per_line(tmp_path, config_file, text):
  root = _repository(tmp_path, {config_file: text})
  train = root / "pkg" / "train.py"
  # The support module, beside the script outside the sorter's source roots, is third
  # party to isort as to ruff.
  google = (*GOOGLE_AS_RUFF, 'lint.isort.known-first-party = ["mylib"]')
  assert _ruff_isort(root, train, *google).returncode == 0
  after = _convert(root)
  assert ("import numpy as np\nfrom pmap_shard_map import per_device\n"
          "from pmap_shard_map import placed_on\n\nimport mylib\n") in after
  check = _ruff_isort(root, train, *google)
  assert check.returncode == 0, check.stdout + "\n" + after


def test_without_configuration_the_file_order_decides(tmp_path):
  root = _repository(tmp_path, {})
  assert import_style.configured(str(root / "pkg" / "train.py")) is None
  after = _convert(root)
  assert after.index("import numpy as np\n") < after.index("from jax.sharding import PartitionSpec")
  assert "from pmap_shard_map import per_device, placed_on\n" in after
  check = _ruff_isort(root, root / "pkg" / "train.py",
                      'lint.isort.known-first-party = ["mylib", "pmap_shard_map"]')
  assert check.returncode == 0, check.stdout + "\n" + after


@pytest.mark.parametrize("files,expected", [
    # ruff that does not sort imports says nothing about their order
    ({"ruff.toml": "line-length = 100\n"}, None),
    ({"ruff.toml": '[lint]\nextend-select = ["I001"]\n'},
     (False, False, frozenset())),
    ({"pyproject.toml": '[tool.ruff]\nselect = ["E", "I"]\n[tool.ruff.isort]\n'
                        'force-single-line = true\n'},
     (False, True, frozenset())),
    # an explicit option overrides the profile's
    ({"tox.ini": "[tool:isort]\nprofile = google\nforce_single_line = false\n"
                 "known_first_party =\n    a\n    b\n"},
     (True, False, frozenset({"a", "b"}))),
    ({"setup.cfg": "[isort]\nprofile = black\n"}, (False, False, frozenset())),
])
def test_configured_style(tmp_path, files, expected):
  root = _repository(tmp_path, files)
  style = import_style.configured(str(root / "pkg" / "train.py"))
  assert (style if style is None else (style.force_sort_within_sections,
                                       style.force_single_line,
                                       style.known_first_party)) == expected


def test_source_roots_say_what_is_first_party(tmp_path):
  root = _repository(tmp_path, {"setup.cfg": "[isort]\nprofile = google\n"})
  (root / "src" / "mylib").mkdir(parents=True)
  style = import_style.configured(str(root / "pkg" / "train.py"))
  assert style is not None and style.source_roots == (str(root), str(root / "src"))
  assert style.first_party("mylib") and style.first_party("pkg")
  assert not style.first_party("pmap_shard_map")  # beside the script, outside the roots
  assert style.first_party("pmap_shard_map", written_in=str(root))
  (root / "pyproject.toml").write_text('[tool.ruff]\nsrc = ["pkg"]\n[tool.ruff.lint]\n'
                                       'select = ["I"]\n')
  style = import_style.configured(str(root / "pkg" / "train.py"))
  assert style is not None and style.source_roots == (str(root / "pkg"),)
  assert style.first_party("train") and not style.first_party("mylib")


def test_the_nearest_configuration_wins_and_nothing_above_the_root_counts(tmp_path):
  (tmp_path / "setup.cfg").write_text("[isort]\nprofile = google\n")  # above the root
  root = _repository(tmp_path, {})
  assert import_style.configured(str(root / "pkg" / "train.py")) is None
  (root / "setup.cfg").write_text("[isort]\nprofile = google\n")
  (root / "pkg" / "ruff.toml").write_text('[lint]\nselect = ["I"]\n')
  style = import_style.configured(str(root / "pkg" / "train.py"))
  assert style is not None and not style.force_sort_within_sections  # ruff's, in pkg/
  assert style.source_roots == (str(root / "pkg"), str(root / "pkg" / "src"))


def test_a_support_module_in_the_files_own_package_is_first_party(tmp_path):
  """Outside the source roots too: ruff counts the file's own package as first party
  (detect-same-package)."""
  root = _repository(tmp_path, {"pyproject.toml": RUFF_FORCE_SORT})
  package = root / "libs" / "trainer"
  package.mkdir(parents=True)
  (package / "__init__.py").write_text("")
  (package / "train.py").write_text(SITE.replace("import mylib\n", "from trainer import util\n")
                                    .replace("mylib.one()", "util.one()"))
  assert _ruff_isort(root, package / "train.py").returncode == 0
  run = subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", str(package),
                        "--in-place"], capture_output=True, text=True, timeout=300,
                       check=False, cwd=pathlib.Path(__file__).resolve().parents[2])
  assert run.returncode == 0, run.stdout + run.stderr
  after = (package / "train.py").read_text()
  blocks = [block.splitlines() for block in after.split("\n\n")]
  first_party = next(b for b in blocks if "from trainer import util" in b)
  assert any(line.startswith("from trainer._pmap_shard_map import ") for line in first_party), after
  check = _ruff_isort(root, package / "train.py")
  assert check.returncode == 0, check.stdout + "\n" + after


@pytest.mark.parametrize("config", [
    ("pyproject.toml", '[tool.ruff.lint]\nselect = ["I"]\n[tool.ruff.lint.isort]\n'
                       'lines-after-imports = 2\n'),  # diffusers', equinox's
    ("setup.cfg", "[isort]\nlines_after_imports = 2\n"),
])
def test_the_support_module_keeps_the_sorters_blank_lines_after_imports(tmp_path, config):
  name, text = config
  root = _repository(tmp_path, {name: text})
  (root / "pkg" / "__init__.py").write_text("")
  assert import_style.configured(str(root / "pkg" / "train.py")).lines_after_imports == 2
  _convert(root)
  support = root / "pkg" / "_pmap_shard_map.py"
  check = _ruff_isort(root, support, "lint.isort.lines-after-imports = 2")
  assert check.returncode == 0, check.stdout + "\n" + support.read_text()
