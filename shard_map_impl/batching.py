"""Batching (BatchTrace): ``vmap`` of a shard_map.

The batched shard_map maps the same mesh; each input's and output's spec is
re-indexed so the inserted batch dimension is skipped (dimensions at or after
it move up by one).  With ``vmap(..., spmd_axis_name=axes)`` the batch
dimension is itself split over ``axes``: it gets those axes in the spec, and
inside the body the batch is correspondingly smaller.  Naming the spmd axes
in a spec is an error, as in JAX (unless ``jax_disable_vmap_shmap_error``).
"""
from __future__ import annotations

from typing import Any
from collections.abc import Sequence
import dataclasses
from math import prod

from jax._src import config
from jax._src import core
from jax._src import linear_util as lu
from jax._src import source_info_util
from jax._src.interpreters import batching
from jax.sharding import PartitionSpec

from shard_map_impl.jax_line import (BATCHED_SPECS_DROP_PARTIAL_SUMS,
                                     EXPLICIT_VMAP_AXES_SPLIT_BATCH, explicit_vmap_axes,
                                     ragged_batch_dims, spec_entries,
                                     without_explicit_mesh_axes)
from shard_map_impl.out_names import DerivedNames
from shard_map_impl.primitive import register_trace_rule
from shard_map_impl.specs import (AnyMesh, AxisNames, OutNamesThunk, canonicalize_spec,
                                  names_to_pspec, partial_sums, spec_axes, with_partial_sums)


def batched_names(names: AxisNames, dim, spmd_axes: Any) -> AxisNames:
  """``names`` of a value whose batch dimension sits at ``dim`` (None: unbatched).

  Built on the spec: the spmd axes (or ``None``) inserted at ``dim``, so the
  spec keeps its spelling (trailing ``None`` dimensions too), as JAX's does.
  """
  if dim is None:
    return names
  parts = list(spec_entries(names_to_pspec(names)))
  parts += [None] * (dim - len(parts))
  parts.insert(dim, tuple(spmd_axes) if spmd_axes is not None else None)
  batched = canonicalize_spec(PartitionSpec(*parts))
  if BATCHED_SPECS_DROP_PARTIAL_SUMS:
    return batched  # as JAX's batched specs: partial sums dropped
  return with_partial_sums(batched, partial_sums(names))


def _reject_vmapped_axes_in(kind: str, all_names: Sequence[AxisNames], spmd_axes: Any,
                            explicit_axes: Any) -> None:
  """Specs may not name the mesh axes the vmap's batch dimension is split over."""
  used = set().union(*map(spec_axes, all_names)) if all_names else set()
  if spmd_axes is not None:
    if used & set(spmd_axes) and not config.disable_vmap_shmap_error.value:
      raise ValueError(f"vmap spmd_axis_name cannot appear in shard_map {kind}")
  elif explicit_axes and used & set(explicit_axes):
    raise ValueError(f"vmapped away explicit mesh axis cannot appear in shard_map {kind}")


@register_trace_rule(batching.BatchTrace)
def batch_rule(trace: batching.BatchTrace, prim: core.Primitive, fun: lu.WrappedFun,
               tracers: Sequence[Any], *,
               mesh: AnyMesh, in_names: Sequence[AxisNames], out_names_thunk: OutNamesThunk,
               check_rep: bool, rewrite: bool, auto: frozenset) -> list:
  vals, dims = zip(*map(trace.to_batch_info, tracers), strict=True) if tracers else ((), ())
  if any(isinstance(d, ragged_batch_dims()) for d in dims):
    raise NotImplementedError("vmap with ragged batch dimensions of shard_map_impl.shard_map")
  spmd_axes = trace.axis_data.spmd_name
  # A vmap over an array sharded on Explicit mesh axes: the batch dimension split over
  # them as over spmd axes where JAX's shard_map does so, else the body sees it
  # unsharded (and, where JAX hides them, those axes hidden while it is bound).
  explicit_axes = explicit_vmap_axes(trace.axis_data)
  _reject_vmapped_axes_in("in_specs", in_names, spmd_axes, explicit_axes)
  split_axes = (explicit_axes if spmd_axes is None and EXPLICIT_VMAP_AXES_SPLIT_BATCH
                else spmd_axes)
  axis_data = trace.axis_data
  if split_axes is not None:
    per_device = axis_data.size // prod(mesh.shape[a] for a in split_axes)
    axis_data = dataclasses.replace(axis_data, size=per_device)
  body, out_dims = batching.batch_subtrace(fun, trace.tag, axis_data, tuple(dims))

  def out_names():
    names = out_names_thunk()
    _reject_vmapped_axes_in("out_specs", names, spmd_axes, explicit_axes)
    return [batched_names(n, d, split_axes) for n, d in zip(names, out_dims(), strict=True)]

  params = dict(
      mesh=mesh,
      in_names=tuple(batched_names(n, d, split_axes) for n, d in zip(in_names, dims, strict=True)),
      out_names_thunk=DerivedNames(out_names, ("vmap", out_names_thunk, dims, spmd_axes,
                                               explicit_axes)),
      check_rep=check_rep, rewrite=rewrite, auto=auto)
  with core.set_current_trace(trace.parent_trace), without_explicit_mesh_axes(explicit_axes):
    outs = prim.bind(body, *vals, **params)
  source_info = source_info_util.current()
  return [batching.BatchTracer(trace, v, d, source_info) if d is not None
          else v for v, d in zip(outs, out_dims(), strict=True)]
