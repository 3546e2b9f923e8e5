"""The efficient-transpose rewrite (``check_rep=True`` without varying-axes types).

With ``jax_varying_axes_in_types`` off, body values carry no record of which
mesh axes they vary along, so transposition alone cannot tell where a
replicated value was combined with a varying one (its cotangent must then be
summed) or where a ``psum`` produced a replicated result (its transpose must
not sum again).  This module re-traces the body while tracking, per value, the
set of mesh axes it is replicated along ("rep"), and makes the conversions
explicit as it goes:

* where operands of different replication meet, the more replicated ones are
  ``pvary``-ed down to the common rep (transpose: ``psum``);
* ``psum`` becomes ``psum_invariant`` (transpose: ``pvary``), its operands
  first ``pvary``-ed along the reduced axes they are replicated on;
* outputs more replicated than their ``out_specs`` require are ``pvary``-ed.

Sub-jaxprs (pjit, remat, scan, while, cond, custom_jvp / custom_vjp) are
rewritten recursively; per-primitive rules live in ``rewrite_rules``.  The
rewritten body transposes correctly with ``rewrite=True`` and no extra
collectives.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable, Iterable, Sequence

from jax._src import core
from jax._src import custom_derivatives as cd
from jax._src import linear_util as lu
from jax._src.interpreters import partial_eval as pe

from shard_map_impl import replication
from shard_map_impl.jax_line import get_aval, psum_invariant
from shard_map_impl.replication import in_names_to_rep
from shard_map_impl.specs import AnyMesh, AxisNames, OutNamesThunk, unmentioned_axes

Rep = frozenset
RewriteRule = Callable[..., tuple[list, list]]

# Per-primitive rules, registered by ``rewrite_rules``; ``rule_for`` falls back
# to the standard or unchanged rule.
rewrite_rules: dict[core.Primitive, RewriteRule] = {}


def register_rewrite_rule(*prims: core.Primitive) -> Callable[[RewriteRule], RewriteRule]:
  def register(rule: RewriteRule) -> RewriteRule:
    for p in prims:
      rewrite_rules[p] = rule
    return rule
  return register


def as_list(prim: core.Primitive, out: Any) -> list:
  return list(out) if prim.multiple_results else [out]


def common_rep(mesh: AnyMesh, reps: Sequence[Rep]) -> Rep:
  out = full_rep(mesh)
  for r in reps:
    out = out & r
  return out


def standard_rule(prim: core.Primitive) -> RewriteRule:
  """Operands ``pvary``-ed down to their common replication, which results get."""
  def rule(mesh: AnyMesh, in_reps: Sequence[Rep], *args: Any, **params: Any):
    target = common_rep(mesh, in_reps)
    args = tuple(vary(mesh, x, r, target) for x, r in zip(args, in_reps, strict=True))
    outs = as_list(prim, prim.bind(*args, **params))
    return outs, [target] * len(outs)
  return rule


def _unchanged_rule(prim: core.Primitive) -> RewriteRule:
  """Bound as is; replication from ``replication.rep_rules``."""
  rep_rule = replication.rep_rules[prim]

  def rule(mesh: AnyMesh, in_reps: Sequence[Rep], *args: Any, **params: Any):
    outs = as_list(prim, prim.bind(*args, **params))
    reps = rep_rule(mesh, *in_reps, **params)
    reps = list(reps) if isinstance(reps, (list, tuple)) else [reps] * len(outs)
    return outs, [full_rep(mesh) if r is None else frozenset(r) for r in reps]
  return rule


def rule_for(prim: core.Primitive) -> RewriteRule:
  rule = rewrite_rules.get(prim)
  if rule is not None:
    return rule
  rep_rule = replication.rep_rules.get(prim)
  if rep_rule is None:
    raise replication.missing_rule(prim)
  rule = standard_rule(prim) if rep_rule is replication.elementwise else _unchanged_rule(prim)
  rewrite_rules[prim] = rule
  return rule


def full_rep(mesh: AnyMesh) -> Rep:
  return frozenset(mesh.axis_names)


def vary(mesh: AnyMesh, x: Any, have: Rep, want: Rep):
  """``x`` (replicated along ``have``) made varying along ``have - want``.

  Only axes bound in the current axis environment can be named by ``pvary``;
  others (auto axes of an enclosing mesh) are left alone.
  """
  bound = core.get_axis_env().axis_sizes
  axes = tuple(a for a in mesh.axis_names if a in have and a not in want and a in bound)
  return core.pvary(x, axes) if axes else x


class RewriteTracer(core.Tracer):
  """A body value during the rewrite: ``payload`` is (value, axes it is replicated on)."""
  __slots__ = ("payload",)
  _trace: RewriteTrace

  def __init__(self, trace: RewriteTrace, val: Any, rep: Rep):
    self._trace, self.payload = trace, (val, rep)

  val = property(lambda self: self.payload[0])
  rep = property(lambda self: self.payload[1])
  aval = property(lambda self: get_aval(self.payload[0]))

  def to_concrete_value(self):
    return core.to_concrete_value(self.payload[0])

  def __repr__(self) -> str:
    value, rep = self.payload
    return f"{value} (replicated along {sorted(map(str, rep))})"


class RewriteTrace(core.Trace):
  """Forwards every operation to its parent trace, rewritten per its rule."""

  def __init__(self, parent_trace: core.Trace, tag: core.TraceTag, mesh: AnyMesh):
    super().__init__()
    self.parent_trace = parent_trace
    self.tag = tag
    self.mesh = mesh

  def lift(self, x: Any) -> tuple[Any, Rep]:
    if isinstance(x, RewriteTracer) and x._trace.tag is self.tag:
      return x.payload
    return x, full_rep(self.mesh)  # constants are the same on every device

  def _wrap(self, vals: Sequence[Any], reps: Sequence[Rep]) -> list:
    return [RewriteTracer(self, v, r) for v, r in zip(vals, reps, strict=True)]

  def _forward(self, tracers: Sequence[Any], emit: Callable) -> list:
    """Lift ``tracers``; ``emit(vals, reps)`` binds on the parent -> (outs, out reps)."""
    vals, reps = unzip_pairs(map(self.lift, tracers))
    with core.set_current_trace(self.parent_trace):
      outs, out_reps = emit(vals, reps)
    return self._wrap(outs, out_reps() if callable(out_reps) else out_reps)

  def process_primitive(self, prim: core.Primitive, tracers: Sequence[Any], params: dict[str, Any]):
    rule = rule_for(prim)
    results = self._forward(tracers, lambda v, r: rule(self.mesh, r, *v, **params))
    return results if prim.multiple_results else results[0]

  def process_call(self, prim: core.Primitive, fun: lu.WrappedFun, tracers: Sequence[Any],
                   params: dict[str, Any]):
    def emit(vals: Sequence[Any], reps: Sequence[Rep]):
      body, out_reps = rewrite_subtrace(fun, self.tag, self.mesh, tuple(reps))
      return prim.bind(body, *vals, **params), out_reps
    return self._forward(tracers, emit)

  def process_map(self, prim: core.Primitive, fun: lu.WrappedFun, tracers: Sequence[Any],
                  params: dict[str, Any]):
    raise NotImplementedError(
        "pmap inside shard_map_impl.shard_map with check_rep=True is not supported; "
        "pass check_rep=False")

  def process_custom_jvp_call(self, prim: core.Primitive, fun: lu.WrappedFun, jvp: lu.WrappedFun,
                              tracers:
                              Sequence[Any], *, symbolic_zeros: bool):
    def emit(vals: Sequence[Any], reps: Sequence[Rep]):
      new_fun, fun_reps = rewrite_subtrace(fun, self.tag, self.mesh, tuple(reps))
      new_jvp, jvp_reps = _rewrite_jvp(jvp, self.tag, self.mesh, tuple(reps) * 2)
      outs = prim.bind(new_fun, new_jvp, *vals, symbolic_zeros=symbolic_zeros)
      return outs, lambda: lu.merge_linear_aux(fun_reps, jvp_reps)[1]
    return self._forward(tracers, emit)

  def process_custom_vjp_call(self, prim: core.Primitive, fun: lu.WrappedFun, fwd: lu.WrappedFun,
                              bwd: lu.WrappedFun,
                              tracers: Sequence[Any], out_trees: Callable, symbolic_zeros: bool):
    if symbolic_zeros:
      raise NotImplementedError(
          "custom_vjp with symbolic_zeros=True inside shard_map_impl.shard_map with "
          "check_rep=True and jax_varying_axes_in_types off; pass check_rep=False")
    mesh = self.mesh

    def emit(vals: Sequence[Any], reps: Sequence[Rep]):
      new_fun, fun_reps = rewrite_subtrace(fun, self.tag, mesh, tuple(reps))
      # fwd takes (primal, is-nonzero flag) pairs; the flags are static bools.
      paired = tuple(r2 for r in reps for r2 in (r, full_rep(mesh)))
      new_fwd, fwd_reps = rewrite_subtrace(fwd, self.tag, mesh, paired)
      outs = prim.bind(new_fun, new_fwd, rewrite_bwd(bwd, mesh, fwd_reps, reps), *vals,
                       out_trees=out_trees, symbolic_zeros=symbolic_zeros)

      def out_reps():
        fun_ran, got = lu.merge_linear_aux(fun_reps, fwd_reps)
        # When fwd ran, its outputs were the residuals followed by the primals.
        return got if fun_ran else got[out_trees()[1].num_leaves:]
      return outs, out_reps
    return self._forward(tracers, emit)


def unzip_pairs(pairs: Iterable[tuple[Any, Any]]) -> tuple[list, list]:
  pairs = list(pairs)
  return [p[0] for p in pairs], [p[1] for p in pairs]


def _run(f: Callable, tag: core.TraceTag, mesh: AnyMesh, in_reps: Sequence[Rep],
         args: Sequence[Any]):
  """Call ``f`` on rewrite tracers; returns (output values, output reps)."""
  with core.take_current_trace() as parent:
    trace = RewriteTrace(parent, tag, mesh)
    tracers = [RewriteTracer(trace, x, frozenset(r)) for x, r in zip(args, in_reps, strict=True)]
    with core.set_current_trace(trace):
      outs = f(*tracers)
    vals, reps = unzip_pairs(map(trace.lift, outs))
  return vals, reps


@lu.transformation_with_aux2
def rewrite_subtrace(f: Callable, store: lu.Store, tag: core.TraceTag, mesh: AnyMesh,
                     in_reps: Sequence[Rep], *args: Any):
  vals, reps = _run(f, tag, mesh, in_reps, args)
  store.store(reps)
  return vals


@lu.transformation_with_aux2
def _rewrite_jvp(f: Callable, store: lu.Store, tag: core.TraceTag, mesh: AnyMesh,
                 in_reps: Sequence[Rep], *args: Any):
  """custom_jvp rule: tangents adopt (at most) their primal's replication."""
  live = [not isinstance(x, cd.SymbolicZero) for x in args]

  def call(*live_args: Any):
    it = iter(live_args)
    return f(*(next(it) if keep else x for x, keep in zip(args, live, strict=True)))

  vals, reps = _run(call, tag, mesh, [r for r, k in zip(in_reps, live, strict=True) if k],
                    [x for x, k in zip(args, live, strict=True) if k])
  n = len(vals) // 2
  primal_reps, tangent_reps = reps[:n], reps[n:]
  for p_rep, t_rep, t in zip(primal_reps, tangent_reps, vals[n:], strict=True):
    if p_rep - t_rep and not isinstance(t, cd.SymbolicZero):
      raise ValueError("custom_jvp primal output is more replicated than its "
                       f"corresponding tangent of type {core.typeof(t).str_short()}")
  tangents = [t if isinstance(t, cd.SymbolicZero) else match(mesh, t, t_rep, p_rep)
              for t, t_rep, p_rep in zip(vals[n:], tangent_reps, primal_reps, strict=True)]
  store.store(primal_reps)
  return [*vals[:n], *tangents]


def match(mesh: AnyMesh, x: Any, have: Rep, want: Rep):
  """Convert ``x`` from replication ``have`` to ``want`` (psum up, pvary down)."""
  bound = core.get_axis_env().axis_sizes
  up = tuple(a for a in mesh.axis_names if a in want and a not in have and a in bound)
  if up:
    x, = psum_invariant([x], up)
  return vary(mesh, x, have, want)


def rewrite_bwd(bwd: lu.WrappedFun, mesh: AnyMesh, in_reps_thunk: Callable,
                out_reps: Sequence[Rep]) -> lu.WrappedFun:
  """custom_vjp bwd rewritten; its cotangents made exactly as replicated as the primals."""
  def new_bwd(*args: Any):
    fun, reps = rewrite_subtrace(bwd, core.TraceTag(), mesh, tuple(in_reps_thunk()))
    cts = fun.call_wrapped(*args)
    return [ct if ct is None else match(mesh, ct, r, want)
            for ct, r, want in zip(cts, reps(), out_reps, strict=True)]
  return lu.wrap_init(new_bwd, debug_info=bwd.debug_info)


def rewrite_jaxpr(mesh: AnyMesh, jaxpr: core.ClosedJaxpr, in_reps: Sequence[Rep],
                  out_reps: Sequence[Rep] | None = None
                  ) -> tuple[core.ClosedJaxpr, list[Rep]]:
  """``jaxpr`` rewritten for inputs replicated along ``in_reps``.

  With ``out_reps``, outputs are additionally ``pvary``-ed down to them (they
  must not ask for more replication than the body provides).
  """
  seen: list = []

  def body(*args: Any):
    vals, reps = _run(lambda *a: core.eval_jaxpr(jaxpr.jaxpr, jaxpr.consts, *a),
                      core.TraceTag(), mesh, in_reps, args)
    seen.append(reps)
    if out_reps is None:
      return vals
    return [vary(mesh, v, r, want) for v, r, want in zip(vals, reps, out_reps, strict=True)]

  new, _, consts, attrs = pe.trace_to_jaxpr_dynamic(
      lu.wrap_init(body, debug_info=jaxpr.jaxpr.debug_info), jaxpr.in_avals)
  assert not attrs
  final = seen[-1] if out_reps is None else list(out_reps)
  return core.ClosedJaxpr(new, consts), final


def efficient_transpose_rewrite(fun: lu.WrappedFun, mesh: AnyMesh, in_names: Sequence[AxisNames],
                                out_names_thunk: Callable) -> lu.WrappedFun:
  """The api's hook: ``fun`` (a flat body) rewritten for efficient transposition."""
  in_reps = tuple(in_names_to_rep(mesh, n) for n in in_names)
  return _rewritten_body(fun, mesh, in_reps, out_names_thunk)


@lu.transformation2
def _rewritten_body(f: Callable, mesh: AnyMesh, in_reps: Sequence[Rep],
                    out_names_thunk: OutNamesThunk, *args: Any):
  vals, reps = _run(f, core.TraceTag(), mesh, in_reps, args)
  wanted = [frozenset(unmentioned_axes(mesh, n)) for n in out_names_thunk()]
  # Outputs less replicated than promised are left for the replication check
  # to report; more replicated ones are made varying as the spec says.
  return [vary(mesh, v, r, want) if want <= r else v
          for v, r, want in zip(vals, reps, wanted, strict=True)]
