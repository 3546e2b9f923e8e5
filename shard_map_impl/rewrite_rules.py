"""Per-primitive rules of the efficient-transpose rewrite (see ``rewrite``).

A rule is ``rule(mesh, in_reps, *args, **params) -> (outs, out_reps)``; it
binds the (possibly replaced) primitive on the current trace after inserting
``pvary`` conversions, and reports each output's replication.

Lookup order: a rule registered here; else, for primitives whose replication
rule is the elementwise one (operands meet), the standard rule (``pvary``
every operand down to the common replication); else the primitive is bound
unchanged and its replication comes from ``replication.rep_rules``.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable, Hashable, Sequence

from jax._src import ad_checkpoint, core, ffi
from jax._src import linear_util as lu
from jax._src.interpreters import partial_eval as pe
from jax._src.lax import control_flow
from jax._src.lax import parallel as lax_parallel

from shard_map_impl import replication
from shard_map_impl.jax_line import custom_vjp_call_jaxpr_p, jit_p, psum_invariant
from shard_map_impl.per_device import manual_axes_of
from shard_map_impl.primitive import register_trace_rule, shard_map_p
from shard_map_impl.rewrite import (RewriteRule, RewriteTrace, as_list, common_rep,
                                    register_rewrite_rule, rewrite_bwd, rewrite_jaxpr,
                                    rewrite_rules, standard_rule, unzip_pairs, vary)
from shard_map_impl.specs import AnyMesh, axis_tuple, spec_axes

# --- collectives --------------------------------------------------------------

@register_rewrite_rule(lax_parallel.psum_p)
def _psum(mesh: AnyMesh, in_reps: Sequence[frozenset], *args: Any, axes: Hashable,
          axis_index_groups: Any):
  if axis_index_groups is not None:
    raise NotImplementedError(
        "psum with axis_index_groups inside shard_map_impl.shard_map with check_rep=True")
  axes = axis_tuple(axes)
  reduced = frozenset(axes)
  # Operands replicated along a reduced axis are first made varying there, so
  # the sum counts each device's copy, as psum does.
  args = tuple(vary(mesh, x, r & reduced, frozenset()) for x, r in zip(args, in_reps, strict=True))
  return psum_invariant(args, axes), [r | reduced for r in in_reps]


def _keeps_varying(prim: core.Primitive) -> RewriteRule:
  def rule(mesh: AnyMesh, in_reps: Sequence[frozenset], x: Any, **params: Any):
    axes = frozenset(axis_tuple(params["axis_name"]))
    rep, = in_reps
    x = vary(mesh, x, rep & axes, frozenset())
    return as_list(prim, prim.bind(x, **params)), [rep - axes]
  return rule


def _reduces(prim: core.Primitive) -> RewriteRule:
  def rule(mesh: AnyMesh, in_reps: Sequence[frozenset], x: Any, **params: Any):
    axes = frozenset(axis_tuple(params["axes"]))
    rep, = in_reps
    x = vary(mesh, x, rep & axes, frozenset())
    outs = as_list(prim, prim.bind(x, **params))
    return outs, [rep | axes] * len(outs)
  return rule


for _p in (lax_parallel.all_gather_p, lax_parallel.all_to_all_p,
           lax_parallel.ppermute_p, lax_parallel.reduce_scatter_p):
  rewrite_rules[_p] = _keeps_varying(_p)
for _p in (lax_parallel.pmin_p, lax_parallel.pmax_p):
  rewrite_rules[_p] = _reduces(_p)
for _p in (control_flow.solves.linear_solve_p, ffi.ffi_call_p):
  rewrite_rules[_p] = standard_rule(_p)


# --- calls --------------------------------------------------------------------

@register_rewrite_rule(jit_p)
def _pjit(mesh: AnyMesh, in_reps: Sequence[frozenset], *args: Any, jaxpr: core.ClosedJaxpr,
          **params: Any):
  new, out_reps = rewrite_jaxpr(mesh, jaxpr, in_reps)
  return list(jit_p.bind(*args, jaxpr=new, **params)), out_reps


@register_rewrite_rule(core.closed_call_p)
def _closed_call(mesh: AnyMesh, in_reps: Sequence[frozenset], *args: Any,
                 call_jaxpr: core.ClosedJaxpr, **params: Any):
  new, out_reps = rewrite_jaxpr(mesh, call_jaxpr, in_reps)
  return list(core.closed_call_p.bind(*args, call_jaxpr=new, **params)), out_reps


@register_rewrite_rule(ad_checkpoint.remat_p)
def _remat(mesh: AnyMesh, in_reps: Sequence[frozenset], *args: Any, jaxpr: core.Jaxpr,
           **params: Any):
  # Closed here, not by pe.close_jaxpr, whose cache entry would keep the body alive.
  new, out_reps = rewrite_jaxpr(mesh, core.ClosedJaxpr(jaxpr, ()), in_reps)
  body = pe.convert_constvars_jaxpr(new.jaxpr)
  outs = ad_checkpoint.remat_p.bind(*new.consts, *args, jaxpr=body, **params) \
      if new.consts else ad_checkpoint.remat_p.bind(*args, jaxpr=new.jaxpr, **params)
  return list(outs), out_reps


# --- control flow -------------------------------------------------------------

@register_rewrite_rule(control_flow.loops.scan_p)
def _scan(mesh: AnyMesh, in_reps: Sequence[frozenset], *args: Any, jaxpr: core.ClosedJaxpr,
          num_consts: int, num_carry: int, **params: Any):
  consts = list(in_reps[:num_consts])
  carry = list(in_reps[num_consts:num_consts + num_carry])
  xs = list(in_reps[num_consts + num_carry:])
  step = lambda c: rewrite_jaxpr(mesh, jaxpr, consts + c + xs)[1][:num_carry]
  carry = replication.loop_fixpoint(step, carry)
  body_in = consts + carry + xs
  _, out_reps = rewrite_jaxpr(mesh, jaxpr, body_in)
  out_reps = carry + out_reps[num_carry:]
  new, _ = rewrite_jaxpr(mesh, jaxpr, body_in, out_reps)
  args = tuple(vary(mesh, x, have, want)
               for x, have, want in zip(args, in_reps, body_in, strict=True))
  outs = control_flow.loops.scan_p.bind(*args, jaxpr=new, num_consts=num_consts,
                                        num_carry=num_carry, **params)
  return list(outs), out_reps


@register_rewrite_rule(control_flow.loops.while_p)
def _while(mesh: AnyMesh, in_reps: Sequence[frozenset], *args: Any, cond_jaxpr: core.ClosedJaxpr,
           body_jaxpr: core.ClosedJaxpr, cond_nconsts: int, body_nconsts: int):
  cconsts = list(in_reps[:cond_nconsts])
  bconsts = list(in_reps[cond_nconsts:cond_nconsts + body_nconsts])
  carry = list(in_reps[cond_nconsts + body_nconsts:])
  step = lambda c: rewrite_jaxpr(mesh, body_jaxpr, bconsts + c)[1]
  carry = replication.loop_fixpoint(step, carry)
  new_cond, _ = rewrite_jaxpr(mesh, cond_jaxpr, cconsts + carry)
  new_body, _ = rewrite_jaxpr(mesh, body_jaxpr, bconsts + carry, carry)
  wanted = cconsts + bconsts + carry
  args = tuple(vary(mesh, x, have, want)
               for x, have, want in zip(args, in_reps, wanted, strict=True))
  outs = control_flow.loops.while_p.bind(
      *args, cond_jaxpr=new_cond, body_jaxpr=new_body, cond_nconsts=cond_nconsts,
      body_nconsts=body_nconsts)
  return list(outs), carry


@register_rewrite_rule(control_flow.conditionals.cond_p)
def _cond(mesh: AnyMesh, in_reps: Sequence[frozenset], index: Any, *args: Any,
          branches: Sequence[core.ClosedJaxpr], **params: Any):
  index_rep, arg_reps = in_reps[0], list(in_reps[1:])
  per_branch = [rewrite_jaxpr(mesh, b, arg_reps)[1] for b in branches]
  out_reps = [common_rep(mesh, column) & index_rep for column in zip(*per_branch, strict=True)]
  new = tuple(rewrite_jaxpr(mesh, b, arg_reps, out_reps)[0] for b in branches)
  outs = control_flow.conditionals.cond_p.bind(index, *args, branches=new, **params)
  return list(outs), out_reps


# --- custom derivatives in jaxpr form ------------------------------------------

def _custom_vjp_jaxpr(mesh: AnyMesh, in_reps: Sequence[frozenset], *args: Any,
                      fun_jaxpr: core.ClosedJaxpr, fwd_jaxpr_thunk: Callable, bwd: lu.WrappedFun,
                      num_consts: int, out_trees: Callable, symbolic_zeros: bool):
  if symbolic_zeros:
    raise NotImplementedError(
        "custom_vjp with symbolic_zeros=True inside shard_map_impl.shard_map with "
        "check_rep=True and jax_varying_axes_in_types off; pass check_rep=False")
  new_fun, out_reps = rewrite_jaxpr(mesh, fun_jaxpr, in_reps)
  fwd = _RewrittenFwd(mesh, fwd_jaxpr_thunk, list(in_reps[num_consts:]))
  assert custom_vjp_call_jaxpr_p is not None  # registered only where it exists
  outs = custom_vjp_call_jaxpr_p.bind(
      *args, fun_jaxpr=new_fun, fwd_jaxpr_thunk=fwd,
      bwd=rewrite_bwd(bwd, mesh, fwd.output_reps, fwd.arg_reps),
      num_consts=num_consts, out_trees=out_trees, symbolic_zeros=symbolic_zeros)
  return list(outs), out_reps


if custom_vjp_call_jaxpr_p is not None:
  register_rewrite_rule(custom_vjp_call_jaxpr_p)(_custom_vjp_jaxpr)


class _RewrittenFwd:
  """``fwd_jaxpr_thunk`` whose jaxprs are rewritten; remembers their output reps."""

  def __init__(self, mesh: AnyMesh, thunk: Callable, arg_reps: Sequence[frozenset]):
    self.mesh, self.thunk, self.arg_reps = mesh, thunk, arg_reps
    self.cache: dict = {}

  def __call__(self, *zeros: Any):
    if zeros not in self.cache:
      new, reps = rewrite_jaxpr(self.mesh, core.ClosedJaxpr(*self.thunk(*zeros)),
                                self.arg_reps)
      self.cache[zeros] = (new, reps)
    new, _ = self.cache[zeros]
    return new.jaxpr, new.consts

  def output_reps(self):
    return next(iter(self.cache.values()))[1]


# --- nested shard_map ---------------------------------------------------------

def nested_shard_map(mesh: AnyMesh, in_reps: Sequence[frozenset], fun: lu.WrappedFun,
                     args: Sequence[Any], params: dict[str, Any]):
  """An inner shard_map: operands meet (like the standard rule); each output is
  replicated along the inner manual axes its out_specs leave unmentioned, and
  along the other axes where every operand was."""
  target = common_rep(mesh, in_reps)
  args = [vary(mesh, x, r, target) for x, r in zip(args, in_reps, strict=True)]
  outs = shard_map_p.bind(fun, *args, **params)
  inner = frozenset(manual_axes_of(params["mesh"], params["auto"]))
  reps = [(target - inner) | (inner - spec_axes(n)) for n in params["out_names_thunk"]()]
  return list(outs), reps


@register_trace_rule(RewriteTrace)
def _nested_shard_map_rule(trace: RewriteTrace, prim: core.Primitive, fun: lu.WrappedFun, tracers:
                           Sequence[Any], **params: Any):
  vals, reps = unzip_pairs(map(trace.lift, tracers))
  with core.set_current_trace(trace.parent_trace):
    outs, out_reps = nested_shard_map(trace.mesh, reps, fun, vals, params)
  return trace._wrap(outs, out_reps)
