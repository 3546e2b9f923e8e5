"""DebugInfo of the bodies shard_map_impl stages: the user's names, kept honest.

The user-facing body gets its DebugInfo from ``api_util.debug_info`` (function
name and source, argument names, result paths), as JAX's shard_map does.
Derived bodies (jvp, partial evaluation, linearize, transpose, remat,
discharge, checkify) reuse their source's DebugInfo, as JAX's rules do, so
errors keep naming the user's function.  Where a derivation changes the
inputs or outputs, the inherited names no longer line up with them; those are
made unknown (empty strings, one per input / output), which is also what
JAX's own ``safe_arg_names`` / ``safe_result_paths`` report for them.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from jax._src import core
from jax._src import linear_util as lu
from jax._src.tree_util import generate_key_paths, keystr
from jax.tree_util import PyTreeDef, tree_unflatten

from shard_map_impl.jax_line import BODY_RESULTS_BY_FLAT_INDEX


def for_arguments(debug_info: core.DebugInfo, kept: Sequence[int]) -> core.DebugInfo:
  """``debug_info`` of a function whose flat arguments are only ``kept`` ones."""
  names = debug_info.arg_names
  if names is None:  # unknown (0.10 spells it None)
    return debug_info
  return debug_info._replace(arg_names=tuple(names[i] for i in kept))


def with_result_paths(fun: lu.WrappedFun, out_tree: Callable[[], PyTreeDef]) -> lu.WrappedFun:
  """``fun`` whose DebugInfo names its flat results, as JAX names a body's.

  0.6's ``lu.wrap_init`` arranges this itself (paths into the output tree);
  0.10's leaves them unknown and JAX's shard_map names them by flat position.
  """
  if fun.debug_info.result_paths is not None:
    return fun
  def paths() -> tuple[str, ...]:
    tree = out_tree()
    if BODY_RESULTS_BY_FLAT_INDEX:
      return tuple(f"result[{i}]" for i in range(tree.num_leaves))
    leaves = tree_unflatten(tree, [object()] * tree.num_leaves)
    return tuple(f"result{keystr(p)}" for p, _ in generate_key_paths(leaves))
  dbg = fun.debug_info._replace(result_paths=paths)
  return lu.WrappedFun(fun.f, fun.f_transformed, fun.transforms, fun.stores,
                       fun.params, fun.in_type, dbg)


def consistent(jaxpr: core.Jaxpr) -> core.Jaxpr:
  """``jaxpr`` with arg names and result paths that describe its own binders."""
  dbg = jaxpr.debug_info
  if callable(dbg.result_paths):
    dbg = dbg.resolve_result_paths()
  paths = dbg.result_paths if isinstance(dbg.result_paths, tuple) else ()
  n_in, n_out = len(jaxpr.invars), len(jaxpr.outvars)
  names = dbg.arg_names
  fixed = dbg._replace(
      arg_names=names if names is not None and len(names) == n_in else ("",) * n_in,
      result_paths=paths if len(paths) == n_out else ("",) * n_out)
  return jaxpr if fixed == jaxpr.debug_info else jaxpr.replace(debug_info=fixed)


def _paths(debug_info: core.DebugInfo) -> tuple[str, ...]:
  """Resolved result paths of a traced function (call after it has run)."""
  paths = debug_info.result_paths
  if callable(paths):
    return tuple(paths())
  # None: unknown; jax 0.10's not-yet-traced marker cannot be left once it has run.
  return paths if isinstance(paths, tuple) else ()


def renamed(fun: lu.WrappedFun, source: core.DebugInfo, arg_names: Sequence[str],
            result_paths: Callable[[tuple[str, ...]], Sequence[str]]) -> lu.WrappedFun:
  """``fun``, derived from a function described by ``source``, with new names.

  ``result_paths`` maps ``source``'s resolved result paths to ``fun``'s; it
  runs once ``fun`` has been traced (result paths are only known then).
  """
  dbg = source._replace(arg_names=tuple(arg_names),
                        result_paths=lambda: tuple(result_paths(_paths(source))))
  return lu.WrappedFun(fun.f, fun.f_transformed, fun.transforms, fun.stores,
                       fun.params, fun.in_type, dbg)


def kept(values: Sequence | None, mask: Sequence[bool]) -> tuple:
  """The ``values`` where ``mask`` is set; unknown names if there are none (jax 0.10's
  names may be None) or lengths differ."""
  if values is None or len(values) != len(mask):
    return unnamed(sum(mask))
  return tuple(v for v, m in zip(values, mask, strict=True) if m)


def known_half(body: core.DebugInfo, known_in: Sequence[bool],
               known_out: Sequence[bool], n_residuals: int) -> core.DebugInfo:
  """DebugInfo of the known half of ``body``: its known inputs, then its known
  outputs followed by the residuals it saves."""
  return body._replace(
      arg_names=kept(body.arg_names, known_in),
      result_paths=(*kept(_paths(body), known_out), *unnamed(n_residuals)))


def unnamed(n: int) -> tuple[str, ...]:
  return ("",) * n
