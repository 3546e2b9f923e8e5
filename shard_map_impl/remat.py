"""Remat: the ``partial_eval_jaxpr_custom`` rule for a staged shard_map equation.

``jax.checkpoint`` (and scan / cond / pjit partial evaluation under a policy)
splits jaxprs equation by equation with ``pe.partial_eval_jaxpr_custom``.
For a shard_map equation the body is split the same way, per device, under
the same saveable policy; the equation becomes a known shard_map (known
outputs + saved residuals) and a staged one (residuals + instantiated inputs
-> staged outputs).  Residuals that are simply known inputs or known outputs
are not emitted twice; the others get specs and rank-0 promotion from
``split_residuals``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from jax._src import core
from jax._src.interpreters import partial_eval as pe
from jax._src.util import partition_list

from shard_map_impl import debug_names, eqn_params
from shard_map_impl import split_residuals as rs
from shard_map_impl.jax_line import eqn_effects
from shard_map_impl.per_device import body_context, unshard_aval
from shard_map_impl.primitive import shard_map_p


def _kept(values: Sequence[Any], mask: Sequence[bool]) -> list:
  return [v for v, m in zip(values, mask, strict=True) if m]


def _forwarding(known: core.Jaxpr, n_outs: int) -> tuple[list[int | None], list[int | None]]:
  """Per residual of ``known``: (known input index | None, known output index | None)."""
  in_index = {v: i for i, v in enumerate(known.invars)}
  out_index: dict[core.Var, int] = {}
  for i, v in enumerate(known.outvars[:n_outs]):
    if type(v) is core.Var:
      out_index.setdefault(v, i)
  in_fwd: list[int | None] = []
  out_fwd: list[int | None] = []
  for v in known.outvars[n_outs:]:
    fwd = in_index.get(v) if type(v) is core.Var else None
    in_fwd.append(fwd)
    out_fwd.append(out_index.get(v) if fwd is None and type(v) is core.Var else None)
  return in_fwd, out_fwd


def remat_rule(saveable: Callable, unks_in: Sequence[bool], inst_in: Sequence[bool],
               eqn: core.JaxprEqn) -> tuple:
  p = eqn_params.read(eqn.params)
  mesh, auto, check_rep = p.mesh, p.auto, p.check
  fresh_axes = rs.newly_manual_axes(mesh, auto)
  with body_context(mesh, auto, check_rep):
    known, staged, unks_out, inst_out, num_res = pe.partial_eval_jaxpr_custom(
        p.jaxpr, unks_in, inst_in, False, False, saveable)
  known = known.replace(debug_info=debug_names.known_half(
      rs.with_fitted_names(p.jaxpr).debug_info, [not u for u in unks_in],
      [not u for u in unks_out], num_res))
  known = debug_names.consistent(known)
  staged = debug_names.consistent(rs.with_fitted_names(staged))
  n_outs = len(known.outvars) - num_res
  in_fwd, out_fwd = _forwarding(known, n_outs)
  fresh = [i is None and o is None for i, o in zip(in_fwd, out_fwd, strict=True)]
  res_avals = [v.aval for v in staged.invars[:num_res]]
  scalar = [f and rs.is_scalar(a) for f, a in zip(fresh, res_avals, strict=True)]

  # Known body: drop forwarded residual outputs, promote rank-0 fresh ones.
  kept = known.replace(outvars=[*known.outvars[:n_outs],
                                *_kept(known.outvars[n_outs:], fresh)])
  kept = rs.retrace_jaxpr(kept, mesh=mesh, auto=auto, check_rep=check_rep,
                          promote_outputs=[s for s, f in zip(scalar, fresh, strict=True) if f])
  staged = rs.retrace_jaxpr(staged, mesh=mesh, auto=auto, check_rep=check_rep,
                            demote_inputs=scalar)

  fresh_names = [rs.residual_names(mesh, check_rep, fresh_axes, a)
                 for a, f in zip(res_avals, fresh, strict=True) if f]
  fresh_avals = [rs.promoted_aval(a) if rs.is_scalar(a) else a
                 for a, f in zip(res_avals, fresh, strict=True) if f]
  gensym = core.gensym()
  fresh_vars = [gensym(unshard_aval(mesh, check_rep, n, a))
                for n, a in zip(fresh_names, fresh_avals, strict=True)]

  ins_known, _ = partition_list(unks_in, eqn.invars)
  names_known_in, _ = partition_list(unks_in, p.in_names)
  outs_known, _ = partition_list(unks_out, eqn.outvars)
  # A known output forwarded as a residual is read by the staged side: one the outer
  # jaxpr dropped needs a variable of its own.
  forwarded = {o for o in out_fwd if o is not None}
  outs_known = [gensym(v.aval) if i in forwarded and isinstance(v, core.DropVar) else v
                for i, v in enumerate(outs_known)]
  names_known_out, _ = partition_list(unks_out, p.out_names)
  _, ins_staged = partition_list(inst_in, eqn.invars)
  _, names_staged_in = partition_list(inst_in, p.in_names)
  _, outs_staged = partition_list(inst_out, eqn.outvars)
  _, names_staged_out = partition_list(inst_out, p.out_names)

  res_vars = rs.resolve_forwarding(in_fwd, out_fwd, ins_known, outs_known, fresh_vars)
  res_names = rs.resolve_forwarding(in_fwd, out_fwd, names_known_in, names_known_out,
                                    fresh_names)
  known_params = eqn_params.to_eqn(p.replace(
      jaxpr=kept, in_names=tuple(names_known_in),
      out_names=(*names_known_out, *fresh_names)), replacing=eqn.params)
  eqn_known = pe.new_jaxpr_eqn(ins_known, [*outs_known, *fresh_vars], shard_map_p,
                               known_params, eqn_effects(kept, ins_known, mesh.axis_names),
                               eqn.source_info, eqn.ctx)
  staged_params = eqn_params.to_eqn(p.replace(
      jaxpr=staged, in_names=(*res_names, *names_staged_in),
      out_names=tuple(names_staged_out), check=rs.staged_check_rep(check_rep)),
      replacing=eqn.params)
  staged_in = [*res_vars, *ins_staged]
  eqn_staged = pe.new_jaxpr_eqn(staged_in, outs_staged, shard_map_p, staged_params,
                                eqn_effects(staged, staged_in, mesh.axis_names),
                                eqn.source_info, eqn.ctx)

  # Vars the enclosing split must make available to the staged side.
  to_save = [x for x, inst in zip(eqn.invars, inst_in, strict=True)
             if type(x) is core.Var and not inst]
  to_save += [outs_known[o] for o in sorted({o for o in out_fwd if o is not None})]
  return eqn_known, eqn_staged, unks_out, inst_out, to_save + fresh_vars


pe.partial_eval_jaxpr_custom_rules[shard_map_p] = remat_rule
