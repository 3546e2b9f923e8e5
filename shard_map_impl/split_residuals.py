"""Residuals of a split shard_map: their specs, rank-0 promotion, thunks.

Partial evaluation, linearization and remat cut one shard_map into a first
half (known / primal) and a second half (unknown / tangent).  Per-device values
the second half needs ("residuals") leave the first shard_map as extra
outputs and enter the second as extra inputs, so each needs a spec:

* a residual that is just a known input or output passed through reuses that
  input's or output's names (no extra output is made for it);
* any other residual is concatenated along its dimension 0 over the mesh
  axes it may vary along: with varying-axes types that is its ``vma``; without
  them, conservatively every axis this shard_map makes manual.

A rank-0 residual has no dimension 0, so it is "promoted" to shape ``(1,)``
before leaving the first half and squeezed back on entering the second.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax import lax
from jax._src import core
from jax._src import linear_util as lu
from jax._src.mesh import get_abstract_mesh

from shard_map_impl.jax_line import (RESIDUAL_SPEC_OMITS_UNSPLIT_DIM, partial_sums_of,
                                     trace_to_jaxpr, varying_axes_typed, vma_of)
from shard_map_impl.per_device import body_context, vma_enabled
from shard_map_impl.specs import NO_SUMS, AnyMesh, AxisNames, with_partial_sums


def newly_manual_axes(mesh: AnyMesh, auto: frozenset) -> tuple:
  """Mesh axes this shard_map turns manual (mesh order).

  Excludes ``auto`` axes, axes already manual in an enclosing shard_map, and
  axes a surrounding ``vmap(spmd_axis_name=...)`` claims.  Call it outside
  the body (the body's own abstract mesh would mark every axis manual).
  """
  env = core.get_axis_env()
  taken = set(auto) | set(env.spmd_axis_names)
  context = get_abstract_mesh()
  if not context.empty:
    taken |= set(context.manual_axes)
  else:
    taken |= set(env.axis_sizes)
  return tuple(a for a in mesh.axis_names if a not in taken)


def residual_names(mesh: AnyMesh, check_rep: bool, fresh_axes: tuple,
                   aval: core.AbstractValue) -> AxisNames:
  """Spec of a non-forwarded residual with per-device type ``aval`` (a partial sum
  stays one: its unreduced/reduced axes are part of its spec)."""
  sums = NO_SUMS
  if vma_enabled(check_rep):
    vma = vma_of(aval)
    axes = tuple(a for a in mesh.axis_names if a in vma)
    sums = partial_sums_of(aval)
  else:
    axes = fresh_axes
  names: AxisNames = {0: axes} if axes or not RESIDUAL_SPEC_OMITS_UNSPLIT_DIM else {}
  return with_partial_sums(names, sums)


def is_scalar(aval: core.AbstractValue) -> bool:
  return not getattr(aval, "shape", ())


def promote(x: Any):
  """Rank-0 residual -> shape (1,), so it can be split along dimension 0."""
  return lax.broadcast(x, (1,))


def demote(x: Any):
  return lax.squeeze(x, (0,))


def promoted_aval(aval: core.AbstractValue) -> core.AbstractValue:
  return core.unmapped_aval(1, 0, aval)


def resolve_forwarding(in_fwd: Sequence[int | None], out_fwd: Sequence[int | None],
                       from_inputs: Sequence, from_outputs: Sequence,
                       fresh: Sequence) -> list:
  """One entry per residual: the input / output it forwards, else the next fresh one.

  Used both for the residual values and for their names.
  """
  fresh_iter = iter(fresh)
  picked = [from_inputs[i] if i is not None else
            from_outputs[o] if o is not None else next(fresh_iter)
            for i, o in zip(in_fwd, out_fwd, strict=True)]
  if next(fresh_iter, fresh_iter) is not fresh_iter:
    raise AssertionError("more fresh residuals than slots")
  return picked


def fit_names(names: Sequence[str] | None, n: int) -> tuple[str, ...]:
  """``names`` if they name exactly ``n`` values, else ``n`` unknown names ('').

  Derived halves reuse their source's DebugInfo; 0.10 marks names it does not
  know as None, and jaxpr checks want one name per binder.
  """
  return tuple(names) if names is not None and len(names) == n else ("",) * n


def fitted_io(debug_info: core.DebugInfo, n_in: int, n_out: int) -> core.DebugInfo:
  """``debug_info`` naming ``n_in`` inputs and ``n_out`` outputs: the names it has
  where they are that many, else unknown ones (as the body JAX stages from a linear
  half's own DebugInfo reads)."""
  paths = debug_info.result_paths if isinstance(debug_info.result_paths, tuple) else None
  return debug_info._replace(arg_names=fit_names(debug_info.arg_names, n_in),
                             result_paths=fit_names(paths, n_out))


def with_fitted_names(jaxpr: core.Jaxpr) -> core.Jaxpr:
  """``jaxpr`` with one (possibly unknown) name per input and output."""
  dbg = jaxpr.debug_info
  fitted = fitted_io(dbg, len(jaxpr.invars), len(jaxpr.outvars))
  return jaxpr if fitted == dbg else jaxpr.replace(debug_info=fitted)


def retrace_jaxpr(jaxpr: core.Jaxpr, *, mesh: AnyMesh, auto: frozenset, check_rep: bool,
                  demote_inputs: Sequence[bool] = (),
                  promote_outputs: Sequence[bool] = ()) -> core.Jaxpr:
  """``jaxpr`` (no constvars) with leading inputs squeezed / trailing outputs promoted.

  ``demote_inputs[i]`` marks input ``i`` as arriving with shape (1,) and
  squeezed before use; ``promote_outputs`` is aligned with the *last*
  outputs, each marked one leaves with shape (1,).  Retraced in the body's
  context, so collectives and varying-axes types stay valid.
  """
  if not any(demote_inputs) and not any(promote_outputs):
    return jaxpr
  assert not jaxpr.constvars
  n_in, n_out = len(demote_inputs), len(promote_outputs)
  avals = [promoted_aval(v.aval) if i < n_in and demote_inputs[i] else v.aval
           for i, v in enumerate(jaxpr.invars)]

  def body(*args: Any):
    args = tuple(demote(x) if i < n_in and demote_inputs[i] else x
                 for i, x in enumerate(args))
    outs = core.eval_jaxpr(jaxpr, (), *args)
    first = len(outs) - n_out
    return [promote(x) if i >= first and promote_outputs[i - first] else x
            for i, x in enumerate(outs)]

  with body_context(mesh, auto, check_rep):
    new_jaxpr, _, consts = trace_to_jaxpr(lu.wrap_init(body, debug_info=jaxpr.debug_info),
                                          avals)
  assert not consts, "retracing a closed body produced constants"
  return new_jaxpr


def staged_check_rep(check_rep: bool) -> bool:
  """check_rep for the halves of a split shard_map.

  Without varying-axes types a half's replication can't be re-derived (its
  residual specs are conservative guesses, its body already rewritten), so,
  as in JAX, only the user-facing shard_map is checked.
  """
  return check_rep if varying_axes_typed() else False
