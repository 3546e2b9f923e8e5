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

from shard_map_impl.device_witness import WITNESS_PARAM, witness_for
from shard_map_impl.out_names import ConstThunk
from shard_map_impl.specs import AnyMesh, AxisNames

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

  def bind(self, fun: lu.WrappedFun, *args: Any, **params: Any):
    # The first operand is a function: skip value canonicalisation.
    return self._true_bind(fun, *args, **params)

  def bind_with_trace(self, trace: core.Trace, fun_and_args: Sequence[Any], params: dict[str, Any]):
    fun, *args = fun_and_args
    rule = lookup_trace_rule(type(trace))
    return rule(trace, self, fun, args, **params)

  def get_bind_params(self, params: dict) -> tuple[list, dict]:
    """Equation params -> ([body fun], bind params) for jaxpr interpreters."""
    bind_params = {k: v for k, v in params.items()
                   if k not in ("jaxpr", "out_names", WITNESS_PARAM)}
    jaxpr: core.Jaxpr = params["jaxpr"]
    body = lu.hashable_partial(
        lu.wrap_init(core.eval_jaxpr, debug_info=jaxpr.debug_info), jaxpr, ())
    bind_params["out_names_thunk"] = ConstThunk(tuple(params["out_names"]))
    return [body], bind_params


shard_map_p = ShardMapPrimitive("shard_map")


def make_eqn_params(*, jaxpr: core.Jaxpr, mesh: AnyMesh, in_names: Sequence[AxisNames],
                    out_names: Sequence[AxisNames], check_rep: bool, rewrite: bool, auto:
                    frozenset) -> dict:
  """Params for a staged ``shard_map_p`` equation.

  Always build equation params with this function (or copy an existing
  equation's params with ``dict(eqn.params, ...)``): besides the documented
  params it attaches a hidden device witness (see ``device_witness``).
  """
  params = dict(jaxpr=jaxpr, mesh=mesh, in_names=tuple(in_names),
                out_names=tuple(out_names), check_rep=check_rep,
                rewrite=rewrite, auto=frozenset(auto))
  witness = witness_for(mesh)
  if witness is not None:
    params[WITNESS_PARAM] = witness
  return params
