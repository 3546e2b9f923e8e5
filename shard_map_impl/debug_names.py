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


def for_arguments(debug_info: core.DebugInfo, kept: Sequence[int]) -> core.DebugInfo:
  """``debug_info`` of a function whose flat arguments are only ``kept`` ones."""
  names = debug_info.arg_names
  return debug_info._replace(arg_names=tuple(names[i] for i in kept))


def consistent(jaxpr: core.Jaxpr) -> core.Jaxpr:
  """``jaxpr`` with arg names and result paths that describe its own binders."""
  dbg = jaxpr.debug_info
  if callable(dbg.result_paths):
    dbg = dbg.resolve_result_paths()
  paths = dbg.result_paths if isinstance(dbg.result_paths, tuple) else ()
  n_in, n_out = len(jaxpr.invars), len(jaxpr.outvars)
  fixed = dbg._replace(
      arg_names=dbg.arg_names if len(dbg.arg_names) == n_in else ("",) * n_in,
      result_paths=paths if len(paths) == n_out else ("",) * n_out)
  return jaxpr if fixed == jaxpr.debug_info else jaxpr.replace(debug_info=fixed)


def _paths(debug_info: core.DebugInfo) -> tuple[str, ...]:
  """Resolved result paths of a traced function (call after it has run)."""
  paths = debug_info.result_paths
  return tuple(paths() if callable(paths) else paths or ())


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


def kept(values: Sequence, mask: Sequence[bool]) -> tuple:
  """The ``values`` where ``mask`` is set; unknown names if lengths differ."""
  if len(values) != len(mask):
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
