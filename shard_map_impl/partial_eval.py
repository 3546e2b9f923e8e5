"""Partial evaluation (JaxprTrace): split a shard_map into known and unknown halves.

This is the path ``jax.grad`` / ``jax.vjp`` / ``jax.linearize`` take in jax
0.6.0, and on 0.10 with ``jax_use_direct_linearize`` off (JVP followed by
partial evaluation).  The body is partially evaluated
per device with the known inputs as constants: the known half runs now as its
own shard_map (bound on the parent trace) and returns the known outputs plus
the residuals; the unknown half is recorded as a ``shard_map_p`` equation
whose inputs are the residuals, any closed-over unknown values (``env``) and
the unknown inputs.  Residual specs and rank-0 promotion come from
``split_residuals``.
"""
from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Callable, Sequence

from jax._src import core
from jax._src import linear_util as lu
from jax._src import source_info_util
from jax._src.interpreters import partial_eval as pe
from jax._src.util import merge_lists, partition_list, split_list

from shard_map_impl import debug_names as dn
from shard_map_impl import split_residuals as rs
from shard_map_impl.out_names import DerivedNames
from shard_map_impl.per_device import body_context, shard_aval, unshard_aval
from shard_map_impl import eqn_params
from shard_map_impl.jax_line import body_effects, name_derived_body, new_eqn_recipe
from shard_map_impl.primitive import ShardMapPrimitive, register_trace_rule
from shard_map_impl.specs import AnyMesh, AxisNames, OutNamesThunk


@dataclasses.dataclass
class _Split:
  """What tracing the known half learned about the unknown half."""
  jaxpr: core.Jaxpr        # constvars: residuals; invars: env, unknown inputs
  out_knowns: list[bool]
  in_fwd: list             # per residual: index of the known input it is, or None
  out_fwd: list            # per residual: index of the known output it is, or None
  fresh_avals: list        # per-device avals of the non-forwarded residuals
  env: list

  @property
  def fresh(self) -> list[bool]:
    return [i is None and o is None for i, o in zip(self.in_fwd, self.out_fwd, strict=True)]


def _positions(values: Sequence[Any], among: Sequence[Any]) -> list[int | None]:
  """Per value: the index of the very same object in ``among``, or None."""
  index = {id(x): i for i, x in enumerate(among)}
  return [index.get(id(v)) for v in values]


def _trace_partial(f: Callable, tag: core.TraceTag, debug_info: core.DebugInfo,
                   pvals: Sequence[pe.PartialVal]) -> tuple[core.Jaxpr, list, list, list]:
  """Partially evaluate ``f`` on ``pvals``: (unknown jaxpr, out pvals, residuals, env)."""
  with core.take_current_trace() as parent:
    trace = pe.JaxprTrace(parent, source_info_util.current_name_stack(), tag)
    out_tracers, jaxpr, residuals, env = pe._trace_to_subjaxpr_nounits(
        f, trace, False, pvals, debug_info)
    out_pvals = [t.pval for t in out_tracers]
  return jaxpr, out_pvals, residuals, env


@lu.transformation_with_aux2
def _known_half(f: Callable, store: lu.Store, tag: core.TraceTag, debug_info: core.DebugInfo,
                in_knowns: tuple, unknown_avals: tuple, *known_vals: Any):
  """Known inputs -> [*known outputs, *fresh residuals (rank 0 promoted)].

  Residuals that are a known input or a known output are not returned again:
  ``in_fwd`` / ``out_fwd`` say which one they are.
  """
  known_iter, unknown_iter = iter(known_vals), iter(unknown_avals)
  pvals = [pe.PartialVal.known(next(known_iter)) if k
           else pe.PartialVal.unknown(next(unknown_iter)) for k in in_knowns]
  jaxpr, out_pvals, residuals, env = _trace_partial(f, tag, debug_info, pvals)
  out_knowns = [pv.is_known() for pv in out_pvals]
  known_outs = [pv.get_known() for pv in out_pvals if pv.is_known()]
  in_fwd = _positions(residuals, known_vals)
  out_fwd = _positions(residuals, known_outs)
  fresh_res = [r for r, i, o in zip(residuals, in_fwd, out_fwd, strict=True)
               if i is None and o is None]
  store.store(_Split(jaxpr, out_knowns, in_fwd, out_fwd,
                     [core.typeof(r) for r in fresh_res], env))
  return [*known_outs,
          *(rs.promote(r) if rs.is_scalar(core.typeof(r)) else r for r in fresh_res)]


@register_trace_rule(pe.JaxprTrace)
def partial_eval_rule(trace: pe.JaxprTrace, prim: ShardMapPrimitive, fun: lu.WrappedFun,
                      tracers: Sequence[Any], *, mesh: AnyMesh, in_names:
                      Sequence[AxisNames], out_names_thunk: OutNamesThunk, check_rep: bool,
                      rewrite: bool, auto: frozenset) -> list:
  tracers = [trace.to_jaxpr_tracer(t) for t in tracers]
  in_knowns = tuple(t.is_known() for t in tracers)
  unknown_in_names, known_in_names = partition_list(in_knowns, in_names)
  unknown_tracers, known_tracers = partition_list(in_knowns, tracers)
  unknown_avals = tuple(shard_aval(mesh, auto, check_rep, n, t.aval)
                        for n, t in zip(unknown_in_names, unknown_tracers, strict=True))
  fresh_axes = rs.newly_manual_axes(mesh, auto)

  known_fun, split_thunk = _known_half(fun, trace.tag, fun.debug_info, in_knowns, unknown_avals)
  # The known half takes the known inputs; returns known outputs, then residuals.
  known_fun = name_derived_body(known_fun, lambda f: dn.renamed(
      f, fun.debug_info,
      dn.kept(rs.fit_names(fun.debug_info.arg_names, len(in_knowns)), in_knowns),
      lambda paths: (*dn.kept(paths, split_thunk().out_knowns),
                     *dn.unnamed(len(split_thunk().fresh_avals)))))

  def fresh_names() -> list:
    return [rs.residual_names(mesh, check_rep, fresh_axes, a)
            for a in split_thunk().fresh_avals]

  def known_out_names() -> list:
    _, known_names = partition_list(split_thunk().out_knowns, out_names_thunk())
    return [*known_names, *fresh_names()]

  known_params = dict(
      mesh=mesh, in_names=tuple(known_in_names),
      out_names_thunk=DerivedNames(known_out_names, ("pe", out_names_thunk, in_knowns)),
      check_rep=rs.staged_check_rep(check_rep), rewrite=rewrite, auto=auto)
  known_vals = [t.pval.get_known() for t in known_tracers]
  outs = prim.bind_with_trace(trace.parent_trace, (known_fun, *known_vals), known_params)

  split = split_thunk()
  known_outs, fresh_res = split_list(outs, [sum(split.out_knowns)])
  unknown_out_names, known_names = partition_list(split.out_knowns, out_names_thunk())
  residuals = rs.resolve_forwarding(split.in_fwd, split.out_fwd, known_vals,
                                    known_outs, fresh_res)
  res_names = rs.resolve_forwarding(split.in_fwd, split.out_fwd, known_in_names,
                                    known_names, fresh_names())
  demote = [f and rs.is_scalar(a) for f, a in
            zip(split.fresh, _fresh_slots(split), strict=True)]
  with body_context(mesh, auto, check_rep):  # jaxpr checks need the body's axis env
    hoisted = pe.convert_constvars_jaxpr(dn.consistent(rs.with_fitted_names(split.jaxpr)))
  body = rs.retrace_jaxpr(hoisted, mesh=mesh, auto=auto, check_rep=check_rep,
                          demote_inputs=demote)

  in_tracers = [*(trace.new_instantiated_const(r) for r in residuals),
                *(trace.to_jaxpr_tracer(e) for e in split.env),
                *unknown_tracers]
  params = eqn_params.make(
      jaxpr=body, mesh=mesh,
      in_names=(*res_names, *({} for _ in split.env), *unknown_in_names),
      out_names=tuple(unknown_out_names), check_rep=rs.staged_check_rep(check_rep),
      rewrite=rewrite, auto=auto)
  out_tracers = [pe.JaxprTracer(trace, pe.PartialVal.unknown(
                     unshard_aval(mesh, check_rep, n, v.aval)), None)
                 for n, v in zip(unknown_out_names, body.outvars, strict=True)]
  recipe = new_eqn_recipe(trace, in_tracers, out_tracers, prim, params,
                          body_effects(body, mesh.axis_names), source_info_util.current())
  for t in out_tracers:
    t.recipe = recipe
  return merge_lists(split.out_knowns, out_tracers, known_outs)


def _fresh_slots(split: _Split) -> list[Any]:
  """Per residual: its fresh per-device aval, or None when it is forwarded."""
  fresh_iter = iter(split.fresh_avals)
  return [next(fresh_iter) if f else None for f in split.fresh]
