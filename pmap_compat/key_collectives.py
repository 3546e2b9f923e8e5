"""Collectives on typed PRNG keys inside a pmap body.

JAX 0.6.0 cannot lower ``lax.all_gather`` of a typed key array (neither legacy pmap
nor shard_map can). When a body receives typed keys, we stage the body to a jaxpr and
replay it, doing each top-level ``all_gather`` of keys on the key data instead and
re-wrapping the result, which is what gathering keys means. Gathers inside a ``jit``
in the body are inlined and fixed too; inside scan / cond / while they are not.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable, Sequence

import jax
from jax import lax
from jax._src import core
from jax._src.lax import parallel
from jax.tree_util import tree_flatten, tree_unflatten

from pmap_compat.jax_line import bind_parts, jit_p


def is_key(x: Any) -> bool:
  dtype = getattr(x, "dtype", None)
  return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _gather_key(x: Any, params: dict) -> Any:
  data = lax.all_gather(jax.random.key_data(x), params["axis_name"],
                        axis_index_groups=params["axis_index_groups"],
                        axis=params["all_gather_dimension"], tiled=params["tiled"])
  return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))


def _replay(jaxpr: core.Jaxpr, consts: Sequence[Any], args: Sequence[Any]) -> list:
  env: dict = {}

  def read(v):
    return v.val if isinstance(v, core.Literal) else env[v]

  for v, x in zip(jaxpr.constvars, consts, strict=True):
    env[v] = x
  for v, x in zip(jaxpr.invars, args, strict=True):
    env[v] = x
  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    if eqn.primitive is parallel.all_gather_p and is_key(eqn.invars[0].aval):
      outs = [_gather_key(ins[0], eqn.params)]
    elif eqn.primitive in _INLINABLE and _has_key_gather(eqn.params["jaxpr"].jaxpr):
      sub = eqn.params["jaxpr"]  # a jit around the gather: inline it
      outs = _replay(sub.jaxpr, sub.consts, ins)
    else:
      subfuns, params = bind_parts(eqn.primitive, eqn.params)
      outs = eqn.primitive.bind(*subfuns, *ins, **params)
      if not eqn.primitive.multiple_results:
        outs = [outs]
    for v, x in zip(eqn.outvars, outs, strict=True):
      env[v] = x
  return [read(v) for v in jaxpr.outvars]


_INLINABLE = (jit_p,)


def _has_key_gather(jaxpr: core.Jaxpr) -> bool:
  """Any all_gather of keys here or inside a jit (which _replay inlines)?"""
  for e in jaxpr.eqns:
    if e.primitive is parallel.all_gather_p and is_key(e.invars[0].aval):
      return True
    if e.primitive in _INLINABLE and _has_key_gather(e.params["jaxpr"].jaxpr):
      return True
  return False


def call_with_key_collectives(fun: Callable[[list], Any], leaves: list) -> Any:
  """``fun(leaves)``, except that all_gather of typed keys in it works."""
  if not any(is_key(x) for x in leaves):
    return fun(leaves)
  found = {}

  def flat(*xs):
    out = fun(list(xs))
    outs, found["tree"] = tree_flatten(out)
    return outs

  closed = jax.make_jaxpr(flat)(*leaves)
  if not _has_key_gather(closed.jaxpr):
    return tree_unflatten(found["tree"], core.eval_jaxpr(closed.jaxpr, closed.consts, *leaves))
  return tree_unflatten(found["tree"], _replay(closed.jaxpr, closed.consts, leaves))
