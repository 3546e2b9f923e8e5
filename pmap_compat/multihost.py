"""Multi-process jobs: host-local arguments in, host-local results out.

With legacy ``jax.pmap`` every process passes only its own slice (the mapped axis
has ``local_device_count`` entries) and gets back arrays over its local devices,
while collectives span all processes. Our compiled program is a global SPMD
program over every device of the job, so each call converts:

* local -> global: the local value is first placed on the process's own devices
  (``inputs.place`` with the local view of the target sharding), then those
  per-device buffers become the addressable shards of the global array. No data
  leaves the process and nothing is gathered.
* global -> local: the addressable shards of a global result are the buffers of a
  local array, again without copies: a ``PmapSharding`` array on jax 0.6 (what legacy
  returns), a NamedSharding one over this process's part of the mesh on jax 0.10 (what
  0.10.2's ``jax.pmap`` returns).

The local view of a global mesh is the block of mesh positions whose devices
belong to this process; it must be a rectangular block (true for pmap's
process-major device order) or we refuse with a clear error.
"""
from __future__ import annotations

import math
from typing import Any
from collections.abc import Sequence

import jax
import numpy as np
from jax._src import core
from jax._src import util
from jax._src.array import ArrayImpl
from jax._src.mesh import Mesh
from jax._src.sharding_impls import NamedSharding

from pmap_compat import blocks, inputs, outputs
from pmap_compat.jax_line import prng

__all__ = ["is_multiprocess", "local_view", "local_to_global", "global_to_local",
           "check_traced_use", "local_shape"]


def is_multiprocess() -> bool:
  """True in a multi-controller job (``jax.process_count() > 1``)."""
  return jax.process_count() > 1


@util.cache(max_size=256, trace_context_in_key=False)
def _local_mesh(mesh: Mesh) -> Mesh:
  """The sub-mesh of ``mesh`` this process owns (same axis names; cached, jax.clear_caches()
  empties the cache)."""
  me = jax.process_index()
  grid = np.asarray(mesh.devices)
  mine = np.vectorize(lambda d: d.process_index == me, otypes=[bool])(grid)
  where = np.nonzero(mine)
  if not where[0].size:
    raise ValueError(f"process {me} owns no device of the pmap mesh {mesh}")
  lo = [int(w.min()) for w in where]
  hi = [int(w.max()) + 1 for w in where]
  block = grid[tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))]
  if block.size != int(mine.sum()):
    raise ValueError(
        f"process {me}'s devices do not form a block of the pmap mesh "
        f"{dict(mesh.shape)}; pmap needs each process's devices contiguous along the "
        "mapped axes (the default device order)")
  return Mesh(block, mesh.axis_names)


def local_view(sharding: NamedSharding) -> NamedSharding:
  """The same spec over this process's block of the mesh."""
  return NamedSharding(_local_mesh(sharding.mesh), sharding.spec)


def _scale(shape: Sequence[int], sharding: NamedSharding, grow: bool) -> tuple:
  """Global shape from a local one (``grow``) or back: mapped dims scale by
  (global extent / local extent) of the mesh axes they are split over."""
  mesh, local = sharding.mesh, _local_mesh(sharding.mesh)
  out = list(shape)
  for d, entry in enumerate(tuple(sharding.spec)[:len(shape)]):
    factor = math.prod(mesh.shape[n] // local.shape[n] for n in blocks.spec_entry_axes(entry))
    out[d] = out[d] * factor if grow else out[d] // factor
  return tuple(out)


def local_shape(x: Any, sharding: NamedSharding) -> tuple:
  """The host-local shape of global array ``x`` laid out by ``sharding``."""
  return _scale(x.shape, sharding, grow=False)


def _key_parts(x: Any) -> tuple[Any, Any] | None:
  """(impl, physical uint32 array) of a typed PRNG key array, None otherwise.
  The physical array is the key array's own storage: nothing is computed."""
  if isinstance(x, prng.PRNGKeyArray):
    return x._impl, x._base_array
  return None


def _one_to_global(x: Any, target: NamedSharding) -> Any:
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return inputs.place(x, target)  # already global
  key = _key_parts(x)
  if key is not None:
    impl, raw = key  # trailing key-data dims stay unsharded under the same spec
    return prng.PRNGKeyArray(impl, _one_to_global(raw, target))
  local = inputs.place(x, local_view(target))
  shape = _scale(local.shape, target, grow=True)
  return jax.make_array_from_single_device_arrays(shape, target, local._arrays)


def local_to_global(leaves: Sequence[Any], targets: Sequence[NamedSharding]) -> list:
  """Host-local leaves (legacy pmap's per-process arguments) as global arrays."""
  return [_one_to_global(x, t) for x, t in zip(leaves, targets, strict=True)]


def _one_to_local(y: Any) -> Any:
  if type(y) is not ArrayImpl:
    key = _key_parts(y)
    if key is not None and not y.is_fully_addressable:
      impl, raw = key
      return prng.PRNGKeyArray(impl, _one_to_local(raw))
    return y
  if y.is_fully_addressable:
    return outputs.as_pmap_array(y)
  if not isinstance(y.sharding, NamedSharding):
    raise NotImplementedError(f"pmap_compat: unexpected result sharding {y.sharding}")
  shape = _scale(y.shape, y.sharding, grow=False)
  aval = core.ShapedArray(shape, y.dtype, weak_type=y.aval.weak_type)
  buffers = [s.data for s in y.addressable_shards]
  return outputs.as_pmap_array(ArrayImpl(aval, local_view(y.sharding), buffers, committed=True))


def global_to_local(outs: Sequence[Any]) -> list:
  """Global results as host-local arrays (see the module docstring for their type)."""
  return [_one_to_local(y) for y in outs]


def check_traced_use(mesh: Mesh) -> None:
  """For pmap staged into an outer jit (or other trace) in a multi-process job.

  There the values are global arrays, so the pmap's mapped axes must cover every
  device of the job for its collectives to span every process. A smaller mapped
  size means host-local data was passed as a global value (legacy pmap raises
  NotImplementedError here too); we refuse instead of reducing over part of it.
  Axes that merely replicate the program over spare devices do not count.
  """
  if not is_multiprocess():
    return
  from pmap_compat import meshes  # pylint: disable=import-outside-toplevel
  mapped = math.prod(size for name, size in mesh.shape.items()
                     if name != getattr(meshes, "SPREAD_AXIS", None))
  if mapped != jax.device_count():
    raise NotImplementedError(
        "pmap_compat.pmap inside jax.jit (or another transformation) in a multi-process "
        f"job must map over all {jax.device_count()} devices of the job so that its "
        f"collectives span every process; this call maps over {mapped} (with legacy "
        "semantics that is the host-local size). Call the pmap outside jit, where each "
        "process passes its local slice, or pass global jax.Arrays whose mapped axis has "
        f"{jax.device_count()} entries (jax.make_array_from_process_local_data)")
