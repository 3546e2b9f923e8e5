"""On a JAX other than the supported one, shard_map_impl and pmap_compat stop at import
with a message naming the supported release; pmap_compat.testing still imports."""
from __future__ import annotations

import jax
import pytest

from shard_map_impl.supported_jax import SUPPORTED
from support.venvs import NEWEST, OLDER, run_python


def test_this_environment_is_supported():
  assert jax.__version__ in SUPPORTED


@pytest.mark.parametrize("version", [NEWEST, *OLDER])
@pytest.mark.parametrize("statement", ["import shard_map_impl", "from pmap_compat import pmap",
                                       "import pmap_compat; pmap_compat.patched"])
def test_other_jax_fails_at_import_naming_the_supported_release(version, statement):
  proc = run_python(version, ["-c", statement], timeout=120)
  assert proc.returncode != 0
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("ImportError: shard_map_impl and pmap_compat support jax "
                         f"{' and '.join(SUPPORTED)}"), proc.stderr
  assert f"this is jax {version}" in last


@pytest.mark.parametrize("version", [NEWEST, *OLDER])
def test_testing_module_still_imports_there(version):
  proc = run_python(version, ["-c", "import pmap_compat.testing as t; print(t.check.__name__)"],
                    timeout=120)
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.strip() == "check"
