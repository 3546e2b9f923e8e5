"""Forward-mode rules: ``jvp`` (JVPTrace) and direct linearization (LinearizeTrace).

JVP runs the body under a JVP trace *inside* one shard_map whose inputs are
the primals followed by the non-zero tangents (tangents share their primal's
spec) and whose outputs are the primal outputs followed by the non-zero
output tangents.

Linearize (``jax.linearize`` / ``grad`` with ``jax_use_direct_linearize`` on
0.6; always on 0.10) splits the shard_map in two: a primal shard_map that also emits residuals,
bound on the parent trace, and a tangent shard_map, bound on the tangent trace,
that evaluates the linear jaxpr from those residuals and the input tangents.
Residual specs and rank-0 promotion come from ``split_residuals``.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable, Sequence

from jax._src import core
from jax._src import linear_util as lu
from jax._src.interpreters import ad
from jax._src.util import split_list

from shard_map_impl import debug_names as dn
from shard_map_impl import split_residuals as rs
from shard_map_impl.jax_line import get_aval, linearize_subtrace, name_derived_body
from shard_map_impl.out_names import DerivedNames
from shard_map_impl.primitive import ShardMapPrimitive, register_trace_rule
from shard_map_impl.specs import AnyMesh, AxisNames, OutNamesThunk


def _pick(values: Sequence[Any], mask: Sequence[bool]):
  return [v for v, m in zip(values, mask, strict=True) if m]


def zero_tangent(primal: Any) -> ad.Zero:
  """The symbolic zero tangent of ``primal``."""
  return ad.Zero(get_aval(primal).to_tangent_aval())


# ------------------------------------------------------------------------ JVP

@lu.transformation_with_aux2
def _flat_tangents(f: Callable, store: lu.Store, nonzero_in: tuple, *args: Any):
  """(primals, tangents) -> flat [*primals, *non-zero tangents], both ways."""
  primals, given = split_list(args, [len(nonzero_in)])
  given_iter = iter(given)
  tangents = [next(given_iter) if nz else zero_tangent(p)
              for p, nz in zip(primals, nonzero_in, strict=True)]
  out_primals, out_tangents = f(primals, tangents)
  nonzero_out = tuple(type(t) is not ad.Zero for t in out_tangents)
  store.store(nonzero_out)
  return [*out_primals, *_pick(out_tangents, nonzero_out)]


@register_trace_rule(ad.JVPTrace)
def jvp_rule(trace: ad.JVPTrace, prim: ShardMapPrimitive, fun: lu.WrappedFun,
             tracers: Sequence[Any], *,
             mesh: AnyMesh, in_names: Sequence[AxisNames], out_names_thunk: OutNamesThunk,
             check_rep: bool, rewrite: bool, auto: frozenset) -> list:
  pairs = [trace.to_primal_tangent_pair(t) for t in tracers]
  primals = tuple(p for p, _ in pairs)
  tangents = tuple(t for _, t in pairs)
  nonzero_in = tuple(type(t) is not ad.Zero for t in tangents)
  body, nonzero_out = _flat_tangents(ad.jvp_subtrace(fun, trace.tag), nonzero_in)
  # Tangent inputs and outputs follow the primals, unnamed.
  body = name_derived_body(body, lambda f: dn.renamed(
      f, fun.debug_info,
      (*rs.fit_names(fun.debug_info.arg_names, len(primals)), *dn.unnamed(sum(nonzero_in))),
      lambda paths: (*rs.fit_names(paths, len(nonzero_out())),
                     *dn.unnamed(sum(nonzero_out())))))

  def out_names():
    names = out_names_thunk()
    return (*names, *_pick(names, nonzero_out()))

  params = dict(mesh=mesh, in_names=(*in_names, *_pick(in_names, nonzero_in)),
                out_names_thunk=DerivedNames(out_names, ("jvp", out_names_thunk, nonzero_in)),
                check_rep=check_rep, rewrite=rewrite, auto=auto)
  outs = prim.bind_with_trace(trace.parent_trace,
                              (body, *primals, *_pick(tangents, nonzero_in)), params)
  mask = nonzero_out()
  out_primals, out_tangents = split_list(outs, [len(mask)])
  tangents_iter = iter(out_tangents)
  return [ad.maybe_jvp_tracer(trace, p, next(tangents_iter)) if nz else p
          for p, nz in zip(out_primals, mask, strict=True)]


# ------------------------------------------------------------------ linearize

class _Promoter:
  """Wraps the primal half: promotes its rank-0 non-forwarded residual outputs."""

  def __init__(self, aux: Any):
    self.aux = aux

  def fresh_mask(self):
    res_avals, _, _, _, in_fwd, out_fwd = self.aux()
    return [i is None and o is None for i, o in zip(in_fwd, out_fwd, strict=True)], res_avals

  def wrap(self, fun: lu.WrappedFun) -> lu.WrappedFun:
    def primal_half(*args: Any):
      outs = fun.call_wrapped(*args)
      fresh, _ = self.fresh_mask()
      n_res = sum(fresh)
      return [rs.promote(x) if i < n_res and rs.is_scalar(core.typeof(x)) else x
              for i, x in enumerate(outs)]
    return lu.wrap_init(primal_half, debug_info=fun.debug_info)


@register_trace_rule(ad.LinearizeTrace)
def linearize_rule(trace: ad.LinearizeTrace, prim: ShardMapPrimitive, fun: lu.WrappedFun,
                   tracers: Sequence[Any],
                   *, mesh: AnyMesh, in_names: Sequence[AxisNames], out_names_thunk:
                   OutNamesThunk, check_rep: bool, rewrite: bool, auto: frozenset) -> list:
  pairs = [trace.to_primal_tangent_pair(t) for t in tracers]
  primals = tuple(p for p, _ in pairs)
  tangents = tuple(t for _, t in pairs)
  nonzero_in = tuple(type(t) is not ad.Zero for t in tangents)
  fresh_axes = rs.newly_manual_axes(mesh, auto)
  primal_fun, aux = linearize_subtrace(fun, trace, nonzero_in, fun.debug_info)
  promoter = _Promoter(aux)
  # The primal half returns the fresh residuals (unnamed) before the outputs.
  primal_fun = name_derived_body(primal_fun, lambda f: dn.renamed(
      f, fun.debug_info, rs.fit_names(fun.debug_info.arg_names, len(primals)),
      lambda paths: (*dn.unnamed(sum(promoter.fresh_mask()[0])),
                     *rs.fit_names(paths, len(aux()[1])))))

  def fresh_residual_names():
    fresh, res_avals = promoter.fresh_mask()
    return [rs.residual_names(mesh, check_rep, fresh_axes, a)
            for a, f in zip(res_avals, fresh, strict=True) if f]

  def primal_out_names():
    return (*fresh_residual_names(), *out_names_thunk())

  primal_params = dict(
      mesh=mesh, in_names=tuple(in_names),
      out_names_thunk=DerivedNames(primal_out_names, ("lin", out_names_thunk, nonzero_in)),
      check_rep=rs.staged_check_rep(check_rep), rewrite=rewrite, auto=auto)
  outs = prim.bind_with_trace(trace.parent_trace, (promoter.wrap(primal_fun), *primals),
                              primal_params)
  res_avals, nonzero_out, lin_jaxpr, env, in_fwd, out_fwd = aux()
  fresh, _ = promoter.fresh_mask()
  fresh_res, primals_out = split_list(outs, [sum(fresh)])
  out_names = out_names_thunk()
  residuals = rs.resolve_forwarding(in_fwd, out_fwd, primals, primals_out, fresh_res)
  res_names = rs.resolve_forwarding(in_fwd, out_fwd, in_names, out_names,
                                    fresh_residual_names())
  squeeze = [f and rs.is_scalar(a) for f, a in zip(fresh, res_avals, strict=True)]
  n_res = len(residuals)

  def tangent_half(*args: Any):
    res, rest = split_list(args, [n_res])
    res = [rs.demote(r) if s else r for r, s in zip(res, squeeze, strict=True)]
    return core.eval_jaxpr(lin_jaxpr, res, *rest)

  tangent_out = tuple(_pick(out_names, nonzero_out))
  tangent_params = dict(
      mesh=mesh,
      in_names=(*res_names, *({} for _ in env), *_pick(in_names, nonzero_in)),
      out_names_thunk=DerivedNames(lambda: tangent_out, ("lin_t", tangent_out)),
      check_rep=rs.staged_check_rep(check_rep), rewrite=rewrite, auto=auto)
  nz_tangents_out = prim.bind_with_trace(
      trace.tangent_trace,
      (lu.wrap_init(tangent_half, debug_info=rs.fitted_io(
          lin_jaxpr.debug_info, len(lin_jaxpr.constvars) + len(lin_jaxpr.invars),
          len(lin_jaxpr.outvars))),
       *residuals, *env, *_pick(tangents, nonzero_in)),
      tangent_params)
  nz_iter = iter(nz_tangents_out)
  return [ad.maybe_linearize_tracer(trace, p, nz, next(nz_iter) if nz
                                    else zero_tangent(p))
          for p, nz in zip(primals_out, nonzero_out, strict=True)]
