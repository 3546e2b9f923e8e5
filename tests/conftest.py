"""Test-session setup: 8 fake CPU devices, shared meshes, the legacy comparison helper, and
the skipping of tests pinned to the other JAX line (jax06_only / jax010_only)."""
import os
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
# tests/ for `support`, the repository root so the real packages win over same-named test dirs.
sys.path.insert(0, TESTS)
sys.path.insert(0, os.path.dirname(TESTS))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from support.devices import require_host_devices  # noqa: E402

require_host_devices(8)  # raises (and so aborts collection) if jax came up with fewer

import pytest  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from support.compare import compare_call, compare_with_legacy  # noqa: E402,F401
from support.jax_lines import MARKERS, running_jax, skip_reason  # noqa: E402
from support.meshes import MESH_SHAPES, make_mesh  # noqa: E402,F401


@pytest.fixture
def mesh8() -> Mesh:
  return make_mesh((8,))


@pytest.fixture
def mesh4x2() -> Mesh:
  return make_mesh((4, 2))


@pytest.fixture
def mesh2x2x2() -> Mesh:
  return make_mesh((2, 2, 2))


@pytest.fixture(params=sorted(MESH_SHAPES), ids=lambda s: "x".join(map(str, s)))
def mesh(request) -> Mesh:
  """Each of the standard meshes in turn."""
  return make_mesh(request.param)


def pytest_collection_modifyitems(config, items):
  """Skips tests pinned to another JAX line; multi-process jobs run one at a time.

  `jax06_only` / `jax010_only` tests are skipped, with their reason, on the other line.
  Multi-process jobs go to one xdist worker (`--dist loadgroup`): two 2-process gloo
  jobs running at once on this 2-core machine were seen to hang (both killed at the
  timeout); serialising them keeps every job bounded.
  """
  version = running_jax()
  for item in items:
    for name in MARKERS:
      marker = item.get_closest_marker(name)
      reason = marker and skip_reason(marker, version)
      if reason:
        item.add_marker(pytest.mark.skip(reason=reason))
    if "2proc" in item.nodeid:  # equivalence cases of the 2-process example
      item.add_marker(pytest.mark.multiprocess)
    if item.get_closest_marker("multiprocess"):
      item.add_marker(pytest.mark.xdist_group("multiprocess-jobs"))
