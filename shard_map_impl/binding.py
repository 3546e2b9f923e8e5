"""Binding ``shard_map_p`` on a flat body, as the public API and eager mode do.

With ``check_rep`` the body is first prepared for differentiation in the
active varying-axes mode: with varying-axes types each output is made
device-varying over the axes its out_spec splits on (out_specs promise nothing
about replication there); without them the efficient-transpose rewrite makes
every replicated-to-varying conversion explicit.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from jax._src import core
from jax._src import linear_util as lu

from shard_map_impl.jax_line import (BODY_TYPES_PARTIAL_SUMS, cast_to_unreduced, implicit_casts,
                                     partial_sums_of, varying_axes_typed, vma_of)
from shard_map_impl.primitive import shard_map_p
from shard_map_impl.rewrite import efficient_transpose_rewrite
from shard_map_impl.specs import AnyMesh, AxisNames, OutNamesThunk, partial_sums, spec_axes


def _pvary_outputs_to_specs(fun: lu.WrappedFun,
                            out_names: OutNamesThunk) -> lu.WrappedFun:
  @lu.transformation2
  def mark(f: Callable, *args: Any):
    outs = f(*args)
    if not implicit_casts():
      return outs
    marked = []
    for x, names in zip(outs, out_names(), strict=True):
      missing = tuple(sorted(spec_axes(names) - vma_of(core.typeof(x)), key=str))
      x = core.pvary(x, missing) if missing else x
      # out_specs declaring a partial sum turn a varying value into one.
      unreduced = (partial_sums(names)[0] - partial_sums_of(core.typeof(x))[0]
                   if BODY_TYPES_PARTIAL_SUMS else ())
      marked.append(cast_to_unreduced(x, tuple(unreduced)) if unreduced else x)
    return marked
  return mark(fun)


def bind_body(fun: lu.WrappedFun, args: Sequence, *, mesh: AnyMesh, in_names: Sequence[AxisNames],
              out_names_thunk: OutNamesThunk, check_rep: bool,
              auto: frozenset) -> Sequence:
  """``shard_map_p.bind`` of ``fun`` (flat inputs and outputs) on ``args``."""
  rewrite = bool(check_rep)
  if rewrite:
    fun = (_pvary_outputs_to_specs(fun, out_names_thunk)
           if varying_axes_typed()
           else efficient_transpose_rewrite(fun, mesh, in_names, out_names_thunk))
  return shard_map_p.bind(fun, *args, mesh=mesh, in_names=tuple(in_names),
                          out_names_thunk=out_names_thunk, check_rep=check_rep,
                          rewrite=rewrite, auto=auto)
