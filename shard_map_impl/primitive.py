"""The ``shard_map`` primitive itself: its class, binding and trace dispatch.

``shard_map_p`` is our own ``core.Primitive`` subclass.  Binding it hands the
body (an ``lu.WrappedFun``) and its arguments to a *trace rule* looked up in a
registry owned by this module, keyed by trace type and resolved along the MRO.
Rule modules (staging, eager, and the transformation modules) register
themselves here; nothing is added to JAX's trace classes.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable, Sequence

from jax._src import core
from jax._src import linear_util as lu

from shard_map_impl import eqn_params
from shard_map_impl.jax_line import bind_on_current_trace, bind_params_of, split_bind
from shard_map_impl.out_names import ConstThunk

TraceRule = Callable[..., Sequence[Any]]

# trace type -> rule(trace, prim, fun, tracers, *, mesh, in_names,
#                    out_names_thunk, check_rep, rewrite, auto)
_trace_rules: dict[type, TraceRule] = {}


def register_trace_rule(trace_type: type) -> Callable[[TraceRule], TraceRule]:
  """Decorator: use ``rule`` when ``shard_map_p`` is bound on ``trace_type``."""
  def register(rule: TraceRule) -> TraceRule:
    _trace_rules[trace_type] = rule
    return rule
  return register


def lookup_trace_rule(trace_type: type) -> TraceRule:
  """The rule for ``trace_type`` or its nearest registered base class."""
  for klass in trace_type.__mro__:
    rule = _trace_rules.get(klass)
    if rule is not None:
      return rule
  raise NotImplementedError(
      f"shard_map_impl.shard_map has no rule for the trace type "
      f"{trace_type.__module__}.{trace_type.__qualname__}; this transformation "
      f"of shard_map is not supported.")


class ShardMapPrimitive(core.Primitive):
  """Primitive class for ``shard_map_impl.shard_map_p`` (multiple results)."""
  multiple_results = True
  skip_canonicalization = True

  def bind(self, *args: Any, **params: Any):
    # The body is a function (first operand, or ``subfuns`` on 0.10): no value
    # canonicalisation; the rule for the current trace does the work.
    fun, operands, params = split_bind(args, params)
    for x in operands:
      if isinstance(x, core.Tracer) and not x._trace.is_valid():
        raise core.escaped_tracer_error(x)
    return bind_on_current_trace(
        lambda trace: lookup_trace_rule(type(trace))(trace, self, fun, operands, **params))

  def bind_with_trace(self, trace: core.Trace, args: Sequence[Any], *rest: Any):
    # ``(trace, (fun, *args), params)``, or 0.10's ``(trace, args, avals, params)``.
    fun, operands, params = split_bind(args, rest[-1])
    return lookup_trace_rule(type(trace))(trace, self, fun, operands, **params)

  def get_bind_params(self, params: dict) -> Any:
    """Equation params -> the body fun and bind params, for jaxpr interpreters."""
    p = eqn_params.read(params)
    body = lu.hashable_partial(
        lu.wrap_init(core.eval_jaxpr, debug_info=p.jaxpr.debug_info), p.jaxpr, ())
    return bind_params_of(body, dict(eqn_params.bind_params(p),
                                     out_names_thunk=ConstThunk(tuple(p.out_names))))


shard_map_p = ShardMapPrimitive("shard_map")
