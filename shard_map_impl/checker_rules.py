"""Entries for our primitive in JAX's checkify and key-reuse tables.

JAX keys these tables by primitive; its own shard_map has entries, ours gets
its own here.
"""
from __future__ import annotations

from typing import Any

from jax._src import checkify
from jax._src import core
from jax._src import linear_util as lu
from jax.experimental.key_reuse import _core as key_reuse
from jax.tree_util import tree_flatten, tree_unflatten

from shard_map_impl import eqn_params
from shard_map_impl.primitive import shard_map_p

# --- checkify -------------------------------------------------------------------

def _checkify_rule(error: Any, enabled_errors: Any, *vals: Any, **params: Any):
  """checkify a shard_map equation: the body is checked per device.

  Incoming error values enter replicated; each device's resulting error comes
  out stacked along a new leading dimension split over every mesh axis, so
  checkify's reduction picks the first failing device, as with JAX's
  shard_map.
  """
  p = eqn_params.read(params)
  mesh, out_names = p.mesh, p.out_names
  err_in, err_tree = tree_flatten(error)
  body = core.ClosedJaxpr(p.jaxpr, ())
  err_out_tree = []

  def checked(*args: Any):
    err = tree_unflatten(err_tree, args[:len(err_in)])
    new_err, outs = checkify.checkify_jaxpr(body, enabled_errors, err,
                                            *args[len(err_in):])
    flat_err, tree = tree_flatten(new_err)
    err_out_tree.append((tree, len(flat_err)))
    return [e[None] for e in flat_err] + list(outs)

  class _OutNames:
    def __call__(self):
      _, n_err = err_out_tree[-1]
      return ({0: tuple(mesh.axis_names)},) * n_err + tuple(out_names)

  fun = lu.wrap_init(checked, debug_info=p.jaxpr.debug_info)
  results = shard_map_p.bind(
      fun, *err_in, *vals,
      **dict(eqn_params.bind_params(p), in_names=({},) * len(err_in) + tuple(p.in_names)),
      out_names_thunk=_OutNames())
  tree, n_err = err_out_tree[-1]
  return tree_unflatten(tree, results[:n_err]), results[n_err:]


def _key_reuse_signature(eqn: core.JaxprEqn):
  return key_reuse.jaxpr_type_signature(eqn_params.read(eqn.params).jaxpr)


checkify.error_checks[shard_map_p] = _checkify_rule
key_reuse.key_reuse_signatures[shard_map_p] = key_reuse.dynamic_key_reuse_signature(
    _key_reuse_signature)
