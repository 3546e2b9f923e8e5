"""Which devices a call runs on, and the (cached) Mesh over them.

Top-level calls of size k use the first k devices of the backend (or ``devices=``),
exactly like legacy pmap. Calls made under an ambient trace (a user's ``jit``, ``vmap``
or ``grad``) may "spread" onto every device of the backend with an extra replicated
mesh axis, so that pmaps of different sizes can live in one ``jit`` (one device
assignment per computation).
"""
from __future__ import annotations

import contextlib
import math
from typing import Any
from collections.abc import Iterator, Sequence

import jax
import numpy as np
from jax._src import mesh as mesh_lib
from jax._src import sharding_impls
from jax._src import util
from jax._src import xla_bridge
from jax.sharding import Mesh

from pmap_compat import errors, jax_line

SPREAD_AXIS = "_pmap_compat_replica"

def backend_devices(backend: str | None, devices: tuple | None) -> tuple:
  """``devices``, else every device of the job (multi-process) or of this process."""
  if devices is not None:
    return devices
  if jax.process_count() > 1:
    return tuple(jax.devices(backend))  # process-major order: process p's slice is contiguous
  return tuple(jax.local_devices(backend=backend))


def is_current(mesh: Mesh) -> bool:
  """Whether ``mesh`` holds this process's current device objects: after
  ``jax.clear_backends()`` JAX makes new ones, and a mesh recorded before holds the old
  ones, which no current array lives on."""
  device = mesh.devices.flat[0]
  return device.client is xla_bridge.get_backend(device.platform)


def may_spread(leaves: Sequence[Any], backend: str | None) -> bool:
  """May a pmap traced under a user's jit with these input leaves spread over every device?

  Not when an input already lives on a mesh of fewer devices: a jit computation runs on
  one set of devices, and on jax 0.10 an input's aval names the mesh it sits on (an
  earlier pmap's result over its k devices, say). Then the pmap keeps to its own first k
  devices, as outside jit. (jax 0.6's avals name no mesh: spreading stays allowed.)
  """
  pool = len(backend_devices(backend, None))
  for x in leaves:
    sharding = getattr(getattr(x, "aval", None), "sharding", None)  # arrays and tracers
    mesh = getattr(sharding, "mesh", None)
    if mesh is not None and not mesh.empty and mesh.size < pool:
      return False
  return True


def build_mesh(axes: Sequence[tuple[Any, int]], backend: str | None, devices: tuple | None,
               spread: bool) -> Mesh:
  """A mesh with one axis per (name, size) in ``axes`` (outermost pmap first)."""
  names = tuple(n for n, _ in axes)
  shape = tuple(s for _, s in axes)
  total = math.prod(shape)
  pool = backend_devices(backend, devices)
  if devices is not None:
    if len(devices) != total:
      raise errors.devices_mismatch(shape[0] if len(shape) == 1 else total, devices)
    chosen = devices
  else:
    if total > len(pool):
      raise errors.too_many_devices(total, len(pool))
    if spread and total < len(pool) and len(pool) % total == 0:
      names += (SPREAD_AXIS,)
      shape += (len(pool) // total,)
      total = len(pool)
    chosen = pool[:total]
  return _mesh(names, shape, tuple(chosen))


@util.cache(max_size=256, trace_context_in_key=False)
def _mesh(names: tuple, shape: tuple, devices: tuple) -> Mesh:
  """One Mesh object per layout, so shardings over it compare and hash cheaply (cached;
  jax.clear_caches() empties the cache)."""
  return Mesh(np.array(devices, dtype=object).reshape(shape), names)


@contextlib.contextmanager
def no_ambient_mesh() -> Iterator[None]:
  """Legacy pmap ignores ``use_mesh`` / ``set_mesh`` contexts: its program only depends on
  its own devices. Ours is traced with those contexts cleared so an ambient mesh can
  neither break tracing nor split the compile cache."""
  with mesh_lib.use_abstract_mesh(mesh_lib.empty_abstract_mesh), \
       sharding_impls._internal_use_concrete_mesh(jax_line.NO_CONCRETE_MESH):
    yield
