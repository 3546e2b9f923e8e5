"""Output representation on jax 0.6: pmap results as ``PmapSharding`` arrays, built
without copies. (jax 0.10 has no PmapSharding: there results stay the NamedSharding
arrays jit returns, as 0.10.2's own ``jax.pmap`` returns them, and the conversions below
return their input unchanged.)

Why ``PmapSharding`` (see the migration guide): ``ArrayImpl.__getitem__`` has a
no-communication path only for ``PmapSharding`` arrays, so ``out[0]`` and Flax's
``unreplicate`` cost what they cost on legacy outputs (a view of one device's
buffer). A jit(shard_map) program's per-device buffers are exactly the rank-kept
``(1, ...)`` blocks a ``PmapSharding`` describes (``jax_pmap_no_rank_reduction``
is on by default), so the conversion only swaps the sharding object: no data
moves. Everything that works on legacy outputs (``np.asarray``, reductions,
``jax.jit`` over them, feeding legacy ``jax.pmap``) therefore works identically.

This module converts shardings both ways and rewraps arrays on the slow path;
on the fast path the C++ dispatcher builds these arrays itself (fastpath.py).
"""
from __future__ import annotations

import math
from typing import Any
from collections.abc import Sequence

import numpy as np
from jax._src import core
from jax._src import dtypes
from jax._src import util
from jax._src.array import ArrayImpl
from jax._src.mesh import Mesh
from jax._src.partition_spec import PartitionSpec
from jax._src.sharding_impls import NamedSharding

from pmap_compat import blocks, jax_line
from pmap_compat.jax_line import PmapSharding, prng

# Layout descriptions of PmapSharding (jax 0.6 only; used only where one is built or read).
_specs = jax_line.sharding_specs

__all__ = ["pmap_sharding_of", "named_of_pmap", "named_of_pmap_cached",
           "named_to_pmap", "as_pmap_array", "wrap_outputs"]


def pmap_sharding_of(sharding: NamedSharding, ndim: int) -> PmapSharding | None:
  """The PmapSharding that puts the same block on the same device as ``sharding``.

  Returns None when there is none (partial/unreduced specs, a mesh axis used for
  nothing but not describable, or a layout a ShardingSpec cannot express); the
  result is checked block by block, so a returned sharding is always exact.
  """
  mesh = sharding.mesh
  spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
  if len(spec) != ndim:
    return None
  dims: list[Any] = []  # a ShardingSpec entry per array dimension
  order: dict[Any, int] = {}  # mesh axis -> position among all chunked mesh axes
  for entry in spec:
    names = blocks.spec_entry_axes(entry)
    if not names:
      dims.append(_specs.NoSharding())
      continue
    for name in names:
      order[name] = len(order)
    dims.append(_specs.Chunked([mesh.shape[n] for n in names]))
  mapping = tuple(_specs.ShardedAxis(order[name]) if name in order
                  else _specs.Replicated(mesh.shape[name]) for name in mesh.axis_names)
  candidate = PmapSharding(np.asarray(mesh.devices).reshape(-1),
                           _specs.ShardingSpec(tuple(dims), mapping))
  # The smallest shape both describe: PmapSharding wants mapped dims of exactly
  # the chunk count.
  shape = tuple(math.prod(d.chunks) if isinstance(d, _specs.Chunked) else 2 for d in dims)
  return candidate if blocks.same_blocks(sharding, candidate, shape) else None


def named_of_pmap(sharding: PmapSharding, shape: tuple) -> NamedSharding | None:
  """A NamedSharding with the same blocks on the same devices as ``sharding``
  (jit accepts it as is, unlike PmapSharding); None if a spec has no such form."""
  spec = sharding.sharding_spec
  chunk_dims = []  # chunk number -> (array dim, chunk size)
  for d, dim in enumerate(spec.sharding):
    if isinstance(dim, _specs.Chunked):
      chunk_dims += [(d, c) for c in dim.chunks]
    elif not isinstance(dim, _specs.NoSharding):
      return None  # Unstacked: rank-reducing layouts have no NamedSharding twin
  sizes, names = [], []
  per_dim: list[list[tuple[int, str]]] = [[] for _ in spec.sharding]
  for m, entry in enumerate(spec.mesh_mapping):
    name = f"_pmap_compat_m{m}"
    names.append(name)
    if isinstance(entry, _specs.ShardedAxis):
      d, size = chunk_dims[entry.axis]
      per_dim[d].append((entry.axis, name))
    else:
      size = entry.replicas
    sizes.append(size)
  devices = np.asarray(sharding.devices).reshape(-1).reshape(sizes)
  grouped = [tuple(n for _, n in sorted(axes)) or None for axes in per_dim]
  parts = [g[0] if g and len(g) == 1 else g for g in grouped]
  named = NamedSharding(Mesh(devices, tuple(names)), PartitionSpec(*parts))
  return named if blocks.same_blocks(sharding, named, shape) else None


# Slow path only (shardings are hashable); jax.clear_caches() empties both caches.
_pmap_sharding_cached = util.cache(max_size=1024, trace_context_in_key=False)(pmap_sharding_of)
named_of_pmap_cached = util.cache(max_size=1024, trace_context_in_key=False)(named_of_pmap)


def named_to_pmap(sharding: Any, ndim: int) -> PmapSharding | None:
  """Cached ``pmap_sharding_of`` for any sharding (None when it has no PmapSharding twin)."""
  if isinstance(sharding, PmapSharding):
    return sharding
  if not jax_line.LEGACY_PMAP_RUNTIME or not isinstance(sharding, NamedSharding):
    return None
  return _pmap_sharding_cached(sharding, ndim)


def as_pmap_array(x: Any) -> Any:
  """``x`` with the equivalent PmapSharding, same buffers; ``x`` itself when it
  has none (typed keys, float0, non-arrays, layouts a ShardingSpec cannot say)."""
  if isinstance(x, prng.PRNGKeyArray):
    # Typed keys: the same conversion on their uint32 storage (legacy's keys are
    # PmapSharding-backed too, so ``keys[0]`` is a view).
    base = as_pmap_array(x._base_array)
    return x if base is x._base_array else prng.PRNGKeyArray(x._impl, base)
  if type(x) is not ArrayImpl or isinstance(x.sharding, PmapSharding):
    return x
  if dtypes.issubdtype(x.dtype, dtypes.extended) or not x.is_fully_addressable:
    return x
  target = named_to_pmap(x.sharding, x.ndim)
  if target is None:
    return x
  return ArrayImpl(core.ShapedArray(x.shape, x.dtype, weak_type=x.aval.weak_type), target,
                   x._arrays, committed=True, _skip_checks=True)


def wrap_outputs(outs: Sequence[Any]) -> list:
  """Slow-path conversion of a flat list of jit outputs to the pmap representation."""
  return [as_pmap_array(o) for o in outs]
