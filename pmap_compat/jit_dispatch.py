"""Steady-state dispatch on jax 0.10: straight into jit's C++ fast path.

jax 0.10 removed the C++ pmap dispatcher that ``fastpath`` drives on jax 0.6. Here the
callable ``pmap`` returns hands a plain top-level call to the shared ``jax.jit`` of the
staged program as it is. On a signature jit has seen, jit's C++ path transfers numpy and
uncommitted inputs, runs the executable and returns its results: the NamedSharding arrays
(spec ``P(axis_name)`` over the pmap's mesh) that 0.10.2's own ``jax.pmap`` returns,
fed back with no copy. Our Python work per call is a few attribute checks.

Everything else goes to the wrapper's ``cache_miss``: calls inside another pmap's body or
under a user's trace, strict replication checks, ``jax_debug_nans`` / ``jax_debug_infs``
checks, multi-process jobs (host-local arguments become global ones and results host-local
again: ``run``), and inputs committed to devices outside the program's mesh, which jit
refuses and we move on device first.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable

from jax._src import config, core, dispatch
from jax._src import tree_util

from pmap_compat import arguments, errors, inputs, meshes, multihost, nesting
from pmap_compat.jax_line import DeviceAssignmentMismatchError

__all__ = ["PmapFunction", "inputs_on_other_devices", "run"]

_trace_ctx = core.trace_ctx
_eval_trace = core.eval_trace
_state = nesting._STATE  # read directly on the hot path
_debug_nans = config.debug_nans
_debug_infs = config.debug_infs


def inputs_on_other_devices(err: Exception) -> bool:
  """Did jit refuse the call only because committed inputs sit on devices other than the
  program's mesh? jit raises that as a ValueError from a DeviceAssignmentMismatchError
  (after tracing succeeded, so a retry does not run the user's function again)."""
  return (isinstance(err, ValueError)
          and isinstance(err.__context__, DeviceAssignmentMismatchError))


def _for_the_slow_path(err: Exception) -> bool:
  """Should a call jit refused go through the slow path instead? Yes for inputs committed
  to other devices (the slow path moves them on device) and for argument errors found
  before the user's function ran: the slow path checks the arguments themselves, not
  jit's view of them, and words the error as legacy does (the type of a value that does
  not match in_axes, a string passed where legacy reports the rank of its shape)."""
  if isinstance(err, errors.InAxesMismatch) or inputs_on_other_devices(err):
    return True
  # jit's refusal of a non-array argument, raised before tracing.
  return isinstance(err, TypeError) and str(err).startswith("Error interpreting argument")


class PmapFunction:
  """What ``pmap`` returns on jax 0.10: a direct jit call when nothing stands in the way.

  ``_cache_size`` / ``_cache_clear()`` are those of jit's call cache, which jax 0.10
  shares between jit objects of the same function (so between the wrappers of one
  function here).
  """
  # Slots: ``functools.update_wrapper`` copies the wrapped function's ``__dict__`` into
  # ours, and that function may itself be a PmapFunction (nested pmaps).
  __slots__ = ("_jitted", "_cache_miss", "_strict", "_direct", "__dict__", "__weakref__")

  def __init__(self, jitted: Any, cache_miss: Callable[..., tuple[Any, Any]], strict: bool):
    self._jitted = jitted
    self._cache_miss = cache_miss
    self._strict = strict  # strict replication: every call needs our Python
    # Decided at the first call: pmap may be applied before jax.distributed.initialize,
    # but once a computation has run the process count is fixed.
    self._direct: bool | None = None

  def __call__(self, *args, **kwargs):
    direct = self._direct
    if direct is None:
      direct = self._direct = not self._strict and not multihost.is_multiprocess()
    if (direct and _state.frame is None and _trace_ctx.trace is _eval_trace
        and not (_debug_nans.value or _debug_infs.value)):
      try:
        return self._jitted(*args, **kwargs)
      except (ValueError, TypeError) as err:
        if not _for_the_slow_path(err):
          raise  # e.g. the user's own error while tracing: not run a second time
    return self._cache_miss(*args, **kwargs)[0]

  @property
  def _cache_size(self) -> int:
    return self._jitted._cache_size()

  def _cache_clear(self) -> None:
    self._jitted._clear_cache()


def run(jitted: Callable, args: tuple, kwargs: dict, plan: inputs.Plan) -> tuple[Any, None]:
  """A top-level call with its inputs placed on the program's mesh first; in a
  multi-process job host-local arguments in, host-local results out."""
  with meshes.no_ambient_mesh():
    dynamic, static = arguments.split_static(args, plan.static_argnums)
    leaves, in_tree = tree_util.tree_flatten((tuple(dynamic), kwargs))
    multiprocess = multihost.is_multiprocess()
    if multiprocess:
      placed = multihost.local_to_global(leaves, plan.in_shardings_flat)
    else:
      placed = inputs.place_leaves(leaves, plan.in_shardings_flat) or leaves
    dyn_placed, kw_placed = tree_util.tree_unflatten(in_tree, placed)
    call_args = arguments.merge_static(dyn_placed, static)
    if dispatch.needs_check_special():
      # jit would re-run a program with a NaN / Inf result op by op to find its source;
      # legacy pmap only reports it (the wrapper words the error as legacy's).
      with config.debug_nans(False), config.debug_infs(False):
        out = jitted(*call_args, **kw_placed)
      dispatch.check_special("pmap", tree_util.tree_leaves(out))
    else:
      out = jitted(*call_args, **kw_placed)
  if multiprocess:
    out_leaves, out_tree = tree_util.tree_flatten(out)
    out = tree_util.tree_unflatten(out_tree, multihost.global_to_local(out_leaves))
  return out, None

