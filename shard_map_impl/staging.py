"""Staging shard_map into jaxprs (``jit``, ``make_jaxpr``): trace rule,
typecheck rule and pretty-printing of the equation.

The body is traced once, per device: its inputs get ``shard_aval``'d avals
and tracing happens under ``per_device.body_context``.  The body's constants are
hoisted to leading inputs (replicated, in_names ``{}``) so the equation's
``jaxpr`` has no constvars.
"""
from __future__ import annotations

from typing import Any, cast
from collections.abc import Callable, Sequence

from jax._src import core
from jax._src import linear_util as lu
from jax._src import source_info_util
from jax._src.interpreters import partial_eval as pe

from shard_map_impl import debug_names, eqn_params, errors
from shard_map_impl.device_witness import WITNESS_PARAM
from shard_map_impl.jax_line import (body_effects, check_flag, emit_eqn, partial_sums_of,
                                     to_jaxpr_tracer, trace_body_to_jaxpr)
from shard_map_impl.per_device import body_context, shard_aval, unshard_aval, axis_env
from shard_map_impl.primitive import register_trace_rule, shard_map_p
from shard_map_impl import replication
from shard_map_impl.specs import AnyMesh, AxisNames


def trace_body(fun: lu.WrappedFun, mesh: AnyMesh, in_names: Sequence[dict],
               in_avals: Sequence[core.AbstractValue], check_rep: bool,
               auto: frozenset):
  """Trace ``fun`` per device -> (jaxpr with constvars, out avals, consts)."""
  local_avals = [shard_aval(mesh, auto, check_rep, names, a)
                 for names, a in zip(in_names, in_avals, strict=True)]
  with body_context(mesh, auto, check_rep):
    jaxpr, out_avals, consts = trace_body_to_jaxpr(fun, local_avals)
  return debug_names.consistent(jaxpr), out_avals, consts


def output_rank_failures(out_names: Sequence[AxisNames],
                         out_avals: Sequence[core.AbstractValue]) -> list:
  """Per output: its aval if its out_spec names a dim it does not have."""
  # A shard_map's outputs are arrays: each aval is a ShapedArray.
  return [a if names and max(names) >= cast(core.ShapedArray, a).ndim else None
          for names, a in zip(out_names, out_avals, strict=True)]


def check_outputs(mesh: AnyMesh, auto: frozenset, check_rep: bool,
                  out_names: Sequence[dict], jaxpr: core.Jaxpr,
                  in_names: Sequence[dict]) -> None:
  """Raise the api's output errors: spec too long, replication unproven.

  ``jaxpr`` must have constvars hoisted (or its constvars count as
  replicated); ``in_names`` describes its invars.
  """
  out_avals = [v.aval for v in jaxpr.outvars]
  fails = output_rank_failures(out_names, out_avals)
  if any(f is not None for f in fails):
    raise errors.OutputRankError(fails)
  if not check_rep:
    return
  reps = replication.output_replication(mesh, auto, check_rep, jaxpr, in_names)
  fails = [None if replication.rep_is_sufficient(mesh, auto, r, n)
           else errors.Unproven(r, frozenset().union(*partial_sums_of(a)))
           for r, n, a in zip(reps, out_names, out_avals, strict=True)]
  if any(f is not None for f in fails):
    raise errors.OutputReplicationError(fails)


def hoist_consts(jaxpr: core.Jaxpr, mesh: AnyMesh, auto: frozenset, check_rep: bool) -> core.Jaxpr:
  """Turn the body's constvars into leading invars."""
  if not jaxpr.constvars:
    return jaxpr
  with body_context(mesh, auto, check_rep):
    return pe.convert_constvars_jaxpr(jaxpr)


@register_trace_rule(pe.DynamicJaxprTrace)
def _stage(trace: pe.DynamicJaxprTrace, prim: core.Primitive, fun: lu.WrappedFun, tracers:
           Sequence[Any], *, mesh: AnyMesh, in_names: Sequence[AxisNames], out_names_thunk:
           Callable, check_rep: bool, rewrite: bool, auto: frozenset):
  src = source_info_util.current()
  tracers = [to_jaxpr_tracer(trace, t, src) for t in tracers]
  body, _, consts = trace_body(fun, mesh, in_names, [t.aval for t in tracers],
                               check_rep, auto)
  body = hoist_consts(body, mesh, auto, check_rep)
  all_names: tuple[AxisNames, ...] = ({},) * len(consts) + tuple(in_names)
  out_names = tuple(out_names_thunk())
  check_outputs(mesh, auto, check_rep, out_names, body, all_names)
  out_avals = [unshard_aval(mesh, check_rep, names, v.aval)
               for names, v in zip(out_names, body.outvars, strict=True)]
  const_tracers = [to_jaxpr_tracer(trace, c, src) for c in consts]
  params = eqn_params.make(jaxpr=body, mesh=mesh, in_names=all_names,
                           out_names=out_names, check_rep=check_rep,
                           rewrite=rewrite, auto=auto)
  return emit_eqn(trace, const_tracers + tracers, out_avals, prim, params,
                  body_effects(body, mesh.axis_names), src)


def _typecheck(_ctx_factory: Any, *in_atoms: Any, **params: Any):
  """core.check_jaxpr rule: binders match sharded inputs, body is well typed,
  outputs are as replicated as out_names promise."""
  p = eqn_params.read(params)
  jaxpr, mesh, auto, check_rep = p.jaxpr, p.mesh, p.auto, p.check
  if len(in_atoms) != len(jaxpr.invars) or len(p.in_names) != len(in_atoms):
    raise core.JaxprTypeError(
        f"shard_map got {len(in_atoms)} operands for a body with "
        f"{len(jaxpr.invars)} inputs and {len(p.in_names)} in_names")
  for i, (binder, atom, names) in enumerate(zip(jaxpr.invars, in_atoms, p.in_names,
                                                strict=True)):
    want = shard_aval(mesh, auto, check_rep, names, atom.aval)
    if not core.typecompat(binder.aval, want):
      raise core.JaxprTypeError(
          f"shard_map operand {i} has per-device type {want.str_short()} but the "
          f"body binds {binder.aval.str_short()} (in_names {names})")
  with axis_env(mesh, auto), check_flag(check_rep):
    core.check_jaxpr(jaxpr)
  if check_rep:
    reps = replication.output_replication(mesh, auto, check_rep, jaxpr, p.in_names)
    for i, (r, names) in enumerate(zip(reps, p.out_names, strict=True)):
      if not replication.rep_is_sufficient(mesh, auto, r, names):
        raise core.JaxprTypeError(
            f"shard_map output {i} is not provably replicated as out_names "
            f"{names} require (inferred replication {r})")
  out_avals = [unshard_aval(mesh, check_rep, names, v.aval)
               for names, v in zip(p.out_names, jaxpr.outvars, strict=True)]
  return out_avals, body_effects(jaxpr, mesh.axis_names)


def _pp_rule(eqn: core.JaxprEqn, context: core.JaxprPpContext, settings: core.JaxprPpSettings):
  """Print like any equation, minus the internal device witness."""
  shown = sorted(k for k in eqn.params if k != WITNESS_PARAM)
  return core._pp_eqn(eqn, context, settings, params=shown)


core.custom_typechecks[shard_map_p] = _typecheck
core.pp_eqn_rules[shard_map_p] = _pp_rule
