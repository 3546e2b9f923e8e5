"""Test-session setup: 8 fake CPU devices, shared meshes and the legacy comparison helper."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

from support.devices import require_host_devices  # noqa: E402

require_host_devices(8)  # raises (and so aborts collection) if jax came up with fewer

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from support.compare import compare_call, compare_with_legacy  # noqa: E402,F401

MESH_SHAPES = {(8,): ("x",), (4, 2): ("x", "y"), (2, 2, 2): ("x", "y", "z")}


def make_mesh(shape: tuple[int, ...], names: tuple[str, ...] | None = None) -> Mesh:
  names = names or MESH_SHAPES[shape]
  n = int(np.prod(shape))
  return Mesh(np.array(jax.devices()[:n]).reshape(shape), names)


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
