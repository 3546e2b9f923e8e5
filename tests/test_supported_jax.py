"""shard_map_impl and pmap_compat run on every jax release from 0.6.0 (the first with
varying-manual-axes types) to 0.10.2: `pip install` next to the two the suite runs on in
full keeps them, shard_map_impl imports on the others, and on a JAX without those types
both packages stop at import naming the nearest release they run on (pmap_compat.testing
still imports there)."""
from __future__ import annotations

import json
import os
import subprocess
import tomllib

import jax
import pytest

from shard_map_impl.supported_jax import OLDEST, SUPPORTED, TESTED
from support.venvs import LEGACY, NEWEST, OLDER, ROOT, python_for, run_python


def test_the_supported_lines_are_the_ones_the_suite_runs_on():
  assert SUPPORTED == (LEGACY, NEWEST)
  assert jax.__version__ in SUPPORTED
  assert TESTED[0] == OLDEST == LEGACY and TESTED[-1] == NEWEST


def declared_dependencies() -> list[str]:
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)["project"]["dependencies"]


def resolve_offline(python: str, requirements: list[str]) -> subprocess.CompletedProcess:
  """pip's resolution of `requirements` next to what `python`'s environment has installed,
  without an index: it succeeds only if the installed packages satisfy them."""
  return subprocess.run(
      [python, "-m", "pip", "install", "--dry-run", "--no-index", "--quiet", "--report", "-",
       *requirements], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("version", SUPPORTED)
def test_pip_keeps_the_installed_supported_jax(version):
  proc = resolve_offline(python_for(version), declared_dependencies())
  assert proc.returncode == 0, proc.stderr
  to_install = [item["metadata"]["name"] for item in json.loads(proc.stdout)["install"]]
  assert to_install == [], f"pip would install {to_install} next to jax {version}"


def test_the_resolution_check_sees_a_pin_to_the_other_line():
  proc = resolve_offline(python_for(NEWEST), [f"jax=={LEGACY}"])
  assert proc.returncode != 0 and f"jax=={LEGACY}" in proc.stderr


@pytest.mark.parametrize("statement", ["import shard_map_impl", "from pmap_compat import pmap",
                                       "import pmap_compat; pmap_compat.patched"])
def test_both_packages_import_on_the_newest_line(statement):
  proc = run_python(NEWEST, ["-c", statement], timeout=120)
  assert proc.returncode == 0, proc.stderr


# The older environments `make venvs` builds: those with varying-manual-axes types import
# shard_map_impl, the others stop naming the nearest release that has them.
IMPORTS = [v for v in OLDER if v in TESTED]
STOPS = [v for v in OLDER if v not in TESTED]


@pytest.mark.parametrize("version", IMPORTS)
def test_shard_map_impl_imports_on_the_other_tested_releases(version):
  proc = run_python(version, ["-c", "import shard_map_impl; print(shard_map_impl.shard_map)"],
                    timeout=120)
  assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("version", STOPS)
@pytest.mark.parametrize("statement", ["import shard_map_impl", "from pmap_compat import pmap",
                                       "import pmap_compat; pmap_compat.patched"])
def test_jax_without_varying_axes_types_fails_at_import_naming_the_nearest(version, statement):
  proc = run_python(version, ["-c", statement], timeout=120)
  assert proc.returncode != 0
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith(f"ImportError: shard_map_impl and pmap_compat need jax {OLDEST} or "
                         "newer"), proc.stderr
  assert f"this is jax {version}" in last and f"Install jax=={OLDEST}" in last


@pytest.mark.parametrize("version", [NEWEST, *OLDER])
def test_testing_module_still_imports_there(version):
  proc = run_python(version, ["-c", "import pmap_compat.testing as t; print(t.check.__name__)"],
                    timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == "check"
