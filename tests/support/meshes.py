"""The standard test meshes over the fake CPU devices."""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh

MESH_SHAPES = {(8,): ("x",), (4, 2): ("x", "y"), (2, 2, 2): ("x", "y", "z")}


def make_mesh(shape: tuple[int, ...], names: tuple[str, ...] | None = None) -> Mesh:
  """A mesh of the first prod(shape) devices, named x, y, z unless ``names`` is given."""
  names = names or MESH_SHAPES[shape]
  n = int(np.prod(shape))
  return Mesh(np.array(jax.devices()[:n]).reshape(shape), names)
