"""Replication checking: which mesh axes each body value is equal along.

A replication type ("rep") is a ``frozenset`` of mesh axis names along which
a value is known to be the same on every device, or ``None`` for a value with
no constraint (literals), which acts as replicated everywhere.

Two modes, following ``jax_varying_axes_in_types``:
* on (jax 0.6.0 default): the body's avals carry ``vma`` (varying manual
  axes), maintained by JAX itself; rep = manual axes - vma.
* off: reps are inferred by walking the body jaxpr with ``rep_rules``, our own
  per-primitive table, below.  The rules infer the most precise rep JAX's
  efficient-transpose rewrite would arrive at (mismatched operands meet at
  their intersection, loops iterate to a fixpoint), so a program is rejected
  exactly when ``out_specs`` promise replication the body cannot prove.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable, Hashable, Iterable, Sequence

from jax._src import ad_checkpoint, ad_util, callback, core, dispatch, ffi, pjit, random
from jax._src import custom_derivatives as cd
from jax._src import debugging
from jax._src import ops
from jax._src.interpreters import ad
from jax._src.lax import (ann, control_flow, convolution, fft, lax, linalg,
                          slicing, special, windowed_reductions)
from jax._src.lax import parallel as lax_parallel

from shard_map_impl import eqn_params
from shard_map_impl.jax_line import (custom_vjp_prims, jax_shard_map_p, jit_p, mesh_cast_prims,
                                     prng, unreplicated_sums_of, vma_of)
from shard_map_impl.per_device import manual_axes_of, vma_enabled
from shard_map_impl.specs import (AnyMesh, AxisNames, axis_tuple, spec_axes,
                                 unmentioned_axes)

Rep = frozenset | None
RepRule = Callable[..., Any]

rep_rules: dict[core.Primitive, RepRule] = {}


# --- conversions --------------------------------------------------------------

def in_names_to_rep(mesh: AnyMesh, names: AxisNames) -> frozenset:
  """An input is replicated along every mesh axis its spec does not mention."""
  return frozenset(unmentioned_axes(mesh, names))


def vma_to_rep(mesh: AnyMesh, auto: frozenset, vma: Iterable) -> frozenset:
  return frozenset(manual_axes_of(mesh, auto)) - frozenset(vma)


def aval_to_rep(mesh: AnyMesh, auto: frozenset, aval: core.AbstractValue) -> frozenset:
  """A typed value is replicated along manual axes it neither varies along nor
  is a partial sum (unreduced/reduced) over."""
  unreduced, reduced = unreplicated_sums_of(aval)
  return vma_to_rep(mesh, auto, vma_of(aval) | unreduced | reduced)


def rep_to_vma(mesh: AnyMesh, auto: frozenset, rep: Rep) -> frozenset:
  if rep is None:
    return frozenset()
  return frozenset(manual_axes_of(mesh, auto)) - rep


def rep_is_sufficient(mesh: AnyMesh, auto: frozenset, rep: Rep, names: AxisNames) -> bool:
  """Does ``rep`` cover every manual axis the output's spec leaves out?"""
  if rep is None:
    return True
  # Axes manual in an enclosing body (a context mesh's Manual axes) promise nothing here.
  outer = set(getattr(mesh, "manual_axes", ()))
  return (set(unmentioned_axes(mesh, names)) - set(auto) - outer) <= rep


def output_replication(mesh: AnyMesh, auto: frozenset, check_rep: bool,
                       jaxpr: core.Jaxpr, in_names: Sequence[AxisNames]) -> list:
  """Reps of a (const-hoisted) body's outputs, in whichever mode is active."""
  if vma_enabled(check_rep):
    return [aval_to_rep(mesh, auto, v.aval) for v in jaxpr.outvars]
  return jaxpr_replication(mesh, jaxpr, [in_names_to_rep(mesh, n) for n in in_names])


# --- the jaxpr walk -----------------------------------------------------------

def _full(mesh: AnyMesh) -> frozenset:
  return frozenset(mesh.axis_names)


def _norm(mesh: AnyMesh, rep: Rep) -> frozenset:
  return _full(mesh) if rep is None else rep


def meet(mesh: AnyMesh, reps: Sequence[Rep]) -> Rep:
  """Greatest lower bound: replicated only where every operand is."""
  known = [r for r in reps if r is not None]
  if not known:
    return None
  out = known[0]
  for r in known[1:]:
    out = out & r
  return out


def missing_rule(prim: core.Primitive) -> NotImplementedError:
  return NotImplementedError(
      f"No replication rule for {prim}. As a workaround, pass the "
      "`check_rep=False` argument to `shard_map`.")


def jaxpr_replication(mesh: AnyMesh, jaxpr: core.Jaxpr, in_reps: Sequence[Rep]) -> list:
  """Reps of ``jaxpr``'s outputs given its inputs' reps (constvars replicated)."""
  env: dict[core.Var, Rep] = {v: _full(mesh) for v in jaxpr.constvars}
  env.update(zip(jaxpr.invars, in_reps, strict=True))
  read = lambda a: env[a] if isinstance(a, core.Var) else None
  for eqn in jaxpr.eqns:
    rule = rep_rules.get(eqn.primitive)
    if rule is None:
      raise missing_rule(eqn.primitive)
    out = rule(mesh, *map(read, eqn.invars), **eqn.params)
    if not eqn.primitive.multiple_results:
      env[eqn.outvars[0]] = out
    elif isinstance(out, (list, tuple)):
      env.update(zip(eqn.outvars, out, strict=True))
    else:
      env.update((v, out) for v in eqn.outvars)
  return [read(v) for v in jaxpr.outvars]


def closed_replication(mesh: AnyMesh, closed: core.ClosedJaxpr,
                       in_reps: Sequence[frozenset | None]) -> list:
  jaxpr = closed.jaxpr if isinstance(closed, core.ClosedJaxpr) else closed
  return jaxpr_replication(mesh, jaxpr, in_reps)


# --- rules --------------------------------------------------------------------

def elementwise(mesh: AnyMesh, *reps: Any, **_: Any):
  return meet(mesh, reps)


def _collective_keeps_varying(mesh: AnyMesh, x: Any, *, axis_name: Hashable, **_: Any):
  """all_gather/all_to_all/ppermute/psum_scatter: varying over axis_name."""
  names = axis_tuple(axis_name)
  return _norm(mesh, x) - frozenset(names)


def _reducing(mesh: AnyMesh, *reps: Any, axes: Hashable, **_: Any):
  """psum/pmin/pmax: the result is equal along the reduced axes."""
  names = frozenset(axis_tuple(axes))
  outs = [_norm(mesh, r) | names for r in reps]
  return outs


def _pmin_pmax(mesh: AnyMesh, x: Any, *, axes: Hashable, **_: Any):
  names = frozenset(axis_tuple(axes))
  return _norm(mesh, x) | names


def _pvary(mesh: AnyMesh, *reps: Any, axes: tuple[Hashable, ...], **_: Any):
  return [_norm(mesh, r) - frozenset(axes) for r in reps]


def _axis_index(mesh: AnyMesh, *, axis_name: Hashable):
  names = axis_tuple(axis_name)
  return _full(mesh) - frozenset(names)


def _call_like(param: str):
  def rule(mesh: AnyMesh, *reps: Any, **params: Any):
    return closed_replication(mesh, params[param], reps)
  return rule


def loop_fixpoint(step: Callable[[list], list], carry: list) -> list:
  """Shrink carry reps until the body maps them to (a superset of) themselves.

  Shared by replication checking and the efficient-transpose rewrite's loops.
  """
  for _ in range(len(carry) + 2):
    new = [c if n is None else (n if c is None else c & n)
           for c, n in zip(carry, step(carry), strict=True)]
    if new == carry:
      return carry
    carry = new
  raise AssertionError("replication fixpoint not reached")


def _scan(mesh: AnyMesh, *reps: Any, jaxpr: core.ClosedJaxpr, num_consts: int, num_carry: int,
          **_: Any):
  consts, carry, xs = (list(reps[:num_consts]),
                       list(reps[num_consts:num_consts + num_carry]),
                       list(reps[num_consts + num_carry:]))
  body = lambda c: closed_replication(mesh, jaxpr, consts + c + xs)[:num_carry]
  carry = loop_fixpoint(body, carry)
  return carry + closed_replication(mesh, jaxpr, consts + carry + xs)[num_carry:]


def _while(mesh: AnyMesh, *reps: Any, cond_jaxpr: core.ClosedJaxpr, body_jaxpr: core.ClosedJaxpr,
           cond_nconsts: int, body_nconsts: int, **_: Any):
  bconsts = list(reps[cond_nconsts:cond_nconsts + body_nconsts])
  carry = list(reps[cond_nconsts + body_nconsts:])
  body = lambda c: closed_replication(mesh, body_jaxpr, bconsts + c)
  carry = loop_fixpoint(body, carry)
  # A device-varying predicate makes the trip count vary too.
  pred, = closed_replication(mesh, cond_jaxpr,
                             list(reps[:cond_nconsts]) + carry)
  if pred is not None:
    carry = [pred if c is None else c & pred for c in carry]
  return carry


def _cond(mesh: AnyMesh, index: Any, *reps: Any, branches: Sequence[core.ClosedJaxpr], **_: Any):
  outs = [closed_replication(mesh, b, reps) for b in branches]
  merged = [meet(mesh, column) for column in zip(*outs, strict=True)]
  if index is not None:
    merged = [index if r is None else r & index for r in merged]
  return merged


def _custom_vjp(mesh: AnyMesh, *reps: Any, **params: Any):
  jaxpr = params["fun_jaxpr"] if "fun_jaxpr" in params else params["call_jaxpr"]
  return closed_replication(mesh, jaxpr, reps)


def _nothing_replicated(mesh: AnyMesh, *_: Any,
                        result_avals: Sequence[core.AbstractValue] | None = None,
                        out_avals: Sequence[core.AbstractValue] | None = None, **__: Any):
  avals = result_avals if result_avals is not None else out_avals
  assert avals is not None, "the primitive's params give its result avals"
  n = len(avals)
  return [frozenset()] * n


def _all_results_meet(count_param: str):
  def rule(mesh: AnyMesh, *reps: Any, **params: Any):
    value = params[count_param]
    n = len(value.solve.out_avals) if count_param == "jaxprs" else len(value)
    return [meet(mesh, reps)] * n
  return rule


def _nested_shard_map(outer_mesh: AnyMesh, *reps: Any, **params: Any):
  """A shard_map nested in a body: replicated along axes it leaves alone only
  where every operand is, and along its own manual axes where its out_specs
  promise so."""
  p = eqn_params.read(params)
  inner_manual = frozenset(manual_axes_of(p.mesh, p.auto))
  outside = meet(outer_mesh, reps)
  outside = _full(outer_mesh) if outside is None else outside
  return [(outside - inner_manual) | (inner_manual - spec_axes(n)) for n in p.out_names]


def _register_standard(modules: Sequence[Any]) -> None:
  for module in modules:
    for value in vars(module).values():
      if isinstance(value, core.Primitive):
        rep_rules.setdefault(value, elementwise)


# Order matters only in that specific rules are registered first and
# ``_register_standard`` never overrides them.
for _p in (lax_parallel.all_gather_p, lax_parallel.all_to_all_p,
           lax_parallel.ppermute_p, lax_parallel.reduce_scatter_p):
  rep_rules[_p] = _collective_keeps_varying
rep_rules[lax_parallel.psum_p] = _reducing
rep_rules[lax_parallel.psum_invariant_p] = _reducing
rep_rules[lax_parallel.pmin_p] = _pmin_pmax
rep_rules[lax_parallel.pmax_p] = _pmin_pmax
rep_rules[core.pvary_p] = _pvary
rep_rules[lax_parallel.axis_index_p] = _axis_index
rep_rules[jit_p] = _call_like("jaxpr")
rep_rules[ad_checkpoint.remat_p] = _call_like("jaxpr")
rep_rules[core.closed_call_p] = _call_like("call_jaxpr")
rep_rules[core.call_p] = _call_like("call_jaxpr")
rep_rules[cd.custom_jvp_call_p] = _call_like("call_jaxpr")
for _p in custom_vjp_prims:
  rep_rules[_p] = _custom_vjp
rep_rules[control_flow.loops.scan_p] = _scan
rep_rules[control_flow.loops.while_p] = _while
rep_rules[control_flow.conditionals.cond_p] = _cond
rep_rules[control_flow.conditionals.platform_index_p] = lambda mesh, *_, **__: _full(mesh)
rep_rules[debugging.debug_callback_p] = lambda mesh, *_, **__: []
rep_rules[callback.pure_callback_p] = _nothing_replicated
rep_rules[callback.io_callback_p] = _nothing_replicated
rep_rules[ad.custom_lin_p] = _nothing_replicated
rep_rules[dispatch.device_put_p] = lambda mesh, *reps, **_: list(reps)
rep_rules[control_flow.solves.linear_solve_p] = _all_results_meet("jaxprs")
rep_rules[ffi.ffi_call_p] = _all_results_meet("result_avals")
rep_rules[lax.tie_p] = lambda mesh, x, y: x
for _p in (control_flow.loops.cumsum_p, control_flow.loops.cumlogsumexp_p,
           control_flow.loops.cumprod_p, control_flow.loops.cummax_p,
           control_flow.loops.cummin_p, pjit.sharding_constraint_p, *mesh_cast_prims):
  rep_rules[_p] = elementwise
_register_standard([lax, slicing, windowed_reductions, special, convolution,
                    fft, linalg, ops, ad_util, prng, ann, random])


def _register_nested() -> None:
  # Ours, and JAX's own shard_map when nested inside ours (same params).
  from shard_map_impl.primitive import shard_map_p
  rep_rules[shard_map_p] = _nested_shard_map
  rep_rules[jax_shard_map_p] = _nested_shard_map

_register_nested()
