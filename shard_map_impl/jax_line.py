"""The one place that knows which JAX line (0.6.0 or 0.10.2) is installed.

Everything the rule modules need that moved, was renamed or behaves
differently between the two supported releases is defined here once, under a
line-neutral name.  Rule modules import these names and never look at
``jax.__version__`` themselves.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
from jax._src import config
from jax._src import core
from jax._src import custom_derivatives as cd
from jax._src import pjit
from jax._src import sharding_impls
from jax._src.interpreters import partial_eval as pe

# 0.10 is the line whose internals this module calls "new"; 0.6 the legacy one.
NEW_LINE = tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 10)

# --- moved modules and primitives --------------------------------------------

if NEW_LINE:
  from jax._src.random import prng  # noqa: F401  (re-exported)
  from jax._src import shard_map as _jax_shard_map
  jit_p: core.Primitive = pjit.jit_p
  SdyShardingList = sharding_impls.SdyArrayList
else:
  from jax._src import prng  # type: ignore[no-redef]  # noqa: F401
  from jax.experimental import shard_map as _jax_shard_map  # type: ignore[no-redef]
  jit_p = pjit.pjit_p  # type: ignore[attr-defined]
  SdyShardingList = sharding_impls.SdyArrayShardingList  # type: ignore[attr-defined]

jax_shard_map_p: core.Primitive = _jax_shard_map.shard_map_p

# Primitives that exist on one line only (absent ones are simply not listed).
mesh_cast_prims: tuple[core.Primitive, ...] = tuple(
    p for p in (getattr(pjit, "mesh_cast_p", None), getattr(pjit, "reshard_p", None))
    if p is not None)
# 0.6's jaxpr-form custom_vjp (only the untyped rewrite mode, a 0.6 mode, needs it).
custom_vjp_call_jaxpr_p: core.Primitive | None = getattr(cd, "custom_vjp_call_jaxpr_p", None)
custom_vjp_prims: tuple[core.Primitive, ...] = tuple(
    p for p in (getattr(cd, "custom_vjp_call_jaxpr_p", None),
                getattr(cd, "custom_vjp_call_p", None))
    if p is not None)

# --- the replication / varying-manual-axes check flag ------------------------

def check_flag(check: bool) -> contextlib.AbstractContextManager:
  """JAX's internal flag making collectives track varying axes (check_rep/check_vma)."""
  return config._check_vma(check) if NEW_LINE else config._check_rep(check)  # type: ignore[attr-defined]


def check_flag_value() -> bool:
  return (config._check_vma.value if NEW_LINE  # type: ignore[attr-defined]
          else config._check_rep.value)  # type: ignore[attr-defined]


def varying_axes_typed() -> bool:
  """Whether checked bodies type values with varying manual axes.

  Optional on 0.6 (``jax_varying_axes_in_types``), always so on 0.10.
  """
  return True if NEW_LINE else config.varying_axes_in_types.value  # type: ignore[attr-defined]


# --- avals --------------------------------------------------------------------

def vma_of(aval: Any) -> frozenset:
  """The manual axes a per-device value may vary along (empty if untyped)."""
  if NEW_LINE:
    mat = getattr(aval, "mat", None)
    return frozenset(mat.varying) if mat is not None else frozenset()
  return frozenset(getattr(aval, "vma", frozenset()))


def with_vma(aval: core.ShapedArray, vma: frozenset, **updates: Any) -> core.ShapedArray:
  """``aval.update(**updates)`` with its varying manual axes set to ``vma``."""
  if NEW_LINE:
    mat = aval.mat.update(varying=frozenset(vma))  # type: ignore[attr-defined]
    return aval.update(manual_axis_type=mat, **updates)
  return aval.update(vma=frozenset(vma), **updates)


def get_aval(x: Any) -> core.AbstractValue:
  return core.typeof(x) if NEW_LINE else core.get_aval(x)  # type: ignore[attr-defined]


# --- binding a primitive whose first operand is a function -------------------

def split_bind(args: Sequence[Any], params: dict[str, Any]) -> tuple[Any, list, dict]:
  """(body, operands, params) of a ``bind`` call in either line's convention.

  0.6 passes the body as the first operand; 0.10's jaxpr interpreters pass it
  as ``subfuns=(body,)``.
  """
  if "subfuns" in params:
    params = dict(params)
    body, = params.pop("subfuns")
    return body, list(args), params
  return args[0], list(args[1:]), params


def bind_params_of(body: Any, bind_params: dict[str, Any]) -> Any:
  """What ``Primitive.get_bind_params`` returns for ``body`` and ``bind_params``."""
  if NEW_LINE:
    return dict(bind_params, subfuns=(body,))
  return [body], bind_params


def bind_on_current_trace(rule: Callable[[core.Trace], Any]) -> Any:
  """Run ``rule(trace)`` with the current trace taken (outer code sees eval)."""
  with core.take_current_trace() as trace:
    return rule(trace)


# --- staging into a jaxpr -----------------------------------------------------

def trace_to_jaxpr(fun: Any, in_avals: Sequence[core.AbstractValue]
                   ) -> tuple[core.Jaxpr, list, list]:
  """(jaxpr, out avals, consts) of ``fun`` (an ``lu.WrappedFun``)."""
  traced = pe.trace_to_jaxpr_dynamic(fun, list(in_avals))
  if not NEW_LINE:
    jaxpr, out_avals, consts, attrs = traced  # type: ignore[misc]
    if attrs:
      raise NotImplementedError("shard_map bodies may not mutate jax attrs")
    return jaxpr, out_avals, consts
  jaxpr, out_avals, consts = traced  # type: ignore[misc]
  return jaxpr, out_avals, consts


def to_jaxpr_tracer(trace: pe.DynamicJaxprTrace, x: Any, source_info: Any) -> Any:
  if NEW_LINE:
    return trace.to_jaxpr_tracer(x, source_info)  # type: ignore[call-arg]
  return trace.to_jaxpr_tracer(x)


def emit_eqn(trace: pe.DynamicJaxprTrace, in_tracers: Sequence[Any],
             out_avals: Sequence[core.AbstractValue], prim: core.Primitive,
             params: dict[str, Any], effects: Any, source_info: Any) -> list:
  """Add one equation to ``trace``'s jaxpr; returns its output tracers."""
  if NEW_LINE:
    return trace.emit_eqn(list(in_tracers), list(out_avals), prim, params,  # type: ignore[attr-defined]
                          effects, source_info)
  outs = [pe.DynamicJaxprTracer(trace, a, source_info) for a in out_avals]
  eqn = pe.new_jaxpr_eqn([trace.getvar(t) for t in in_tracers],  # type: ignore[attr-defined]
                         [trace.makevar(t) for t in outs], prim, params,  # type: ignore[attr-defined]
                         effects, source_info)
  trace.frame.add_eqn(eqn)
  return outs


def body_effects(jaxpr: core.Jaxpr, axis_names: Sequence[Any]) -> Any:
  """The effects a shard_map equation with this body has outside."""
  effects = core.positional_effects(jaxpr) if NEW_LINE else jaxpr.effects  # type: ignore[attr-defined]
  return core.filter_named_axis_effects(effects, axis_names)


@contextlib.contextmanager
def no_context() -> Iterator[None]:
  yield
