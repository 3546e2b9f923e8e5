"""The callable ``pmap`` returns: legacy's surface around one shared jit per config.

Steady-state calls never enter Python: jax's C++ pmap call cache runs our compiled
jit(shard_map) executable (``fastpath``, issue 6). A cache miss comes to ``cache_miss``,
which handles nested calls, calls under a user's trace, strict replication checks and
first calls; the plain-jit slow path moves misplaced inputs onto the mesh and retries.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
from jax._src import core, dispatch
from jax._src.interpreters import partial_eval as pe
from jax.tree_util import keystr, tree_flatten, tree_flatten_with_path, tree_unflatten

from pmap_compat import axes as axes_lib
from pmap_compat import aot, cache, errors, fastpath, nesting, outputs, program
from pmap_compat.config import PmapConfig

_trace_ctx = core.trace_ctx
_eval_trace = core.eval_trace
_state = nesting._STATE  # read directly on the hot path


def _under_jit() -> bool:
  """Is a jaxpr being staged somewhere up the chain of active traces?"""
  t = _trace_ctx.trace
  while t is not None:
    if isinstance(t, pe.DynamicJaxprTrace):
      return True
    t = getattr(t, "parent_trace", None)
  return False


def _place_inputs(entry: cache.Entry, spread: bool, args: tuple, kwargs: dict):
  """Moves the dynamic leaves onto the mesh; None when nothing needed moving."""
  staged_meshes = (entry.spread() if spread else entry.top).__wrapped__.meshes_used
  call, mesh, shardings = program.input_shardings(entry.cfg, entry.fun_ref(), args, kwargs,
                                                  spread, staged_meshes)
  if mesh is None:
    return None
  from pmap_compat import placement  # noqa: PLC0415 (slow path only)
  moved = placement.place_leaves(call.leaves, shardings)
  if moved is None:
    return None
  dyn, new_kwargs = tree_unflatten(call.in_tree, moved)
  dyn = iter(dyn)
  new_args = tuple(call.static_values[i] if i in call.static_values else next(dyn)
                   for i in range(call.n_args))
  return new_args, new_kwargs


def _recover(entry: cache.Entry, spread: bool, run: Callable, err: Exception, args: tuple,
             kwargs: dict) -> Any:
  """After jit refused a call: move the inputs onto the mesh and retry, or re-raise ``err``."""
  try:
    placed = _place_inputs(entry, spread, args, kwargs)
  except Exception:  # pylint: disable=broad-except
    placed = None  # the inputs themselves are the problem: jit's own error says it best
  if placed is None:
    raise err
  return run(*placed[0], **placed[1])


def _with_placement(entry: cache.Entry, fun: Callable,
                    method: Callable[[Any], Callable]) -> Callable:
  """``method(jitted)(*args, **kwargs)``, retried once with the inputs moved if it fails.

  Holds ``fun`` so that ``pmap(f).lower`` keeps working after the wrapper itself is gone
  (the shared entry only holds ``fun`` weakly).
  """

  def run(*args, **kwargs):
    if _state.frame is not None:
      raise TypeError("pmap .lower()/.trace() cannot be used inside another pmap's body")
    spread = _trace_ctx.trace is not _eval_trace and _under_jit()
    target = method(entry.spread() if spread else entry.top)
    try:
      return target(*args, **kwargs)
    except Exception as err:  # pylint: disable=broad-except
      failure = err
    return _recover(entry, spread, target, failure, args, kwargs)
  run.keep_alive = fun
  return run


def _ahead_of_time(entry: cache.Entry, fun: Callable, method: str) -> Callable:
  """``.lower`` / ``.trace``: jit's, on host-local arguments in a multi-process job."""
  local = _with_placement(entry, fun, lambda j: getattr(j, method))

  def stage(*args, **kwargs):
    if program.local_size_is_global():
      return aot.as_pmap_stage(local(*args, **kwargs))
    return aot.stage_multiprocess(method, entry.top, entry.cfg, fun, args, kwargs)
  return stage


def _check_replicated(cfg: PmapConfig, out: Any, flags: tuple) -> None:
  if not flags or isinstance(flags[0], core.Tracer):
    return  # only checkable once values exist; under a trace the flags are abstract
  varied = [bool(np.asarray(f)) for f in flags]
  if any(varied):
    paths = [keystr(p) or "<output>" for (p, _), d in
             zip(tree_flatten_with_path(out)[0], axes_lib.out_axes_per_leaf(cfg.out_axes, out))
             if d is None]
    raise errors.replicated_output_varies([p for p, v in zip(paths, varied) if v])


def _as_pmap_outputs(out: Any) -> Any:
  """Top-level slow-path results in legacy's representation (PmapSharding, same buffers)."""
  leaves, tree = tree_flatten(out)
  return tree_unflatten(tree, outputs.wrap_outputs(leaves))


def make_wrapper(fun: Callable, cfg: PmapConfig) -> Callable:
  """The object ``pmap`` returns: jax's C++ pmap call cache in front of our programs.

  On a signature it has seen, the C++ dispatcher runs our compiled jit(shard_map)
  executable without entering Python (see ``fastpath``). Everything else lands in
  ``cache_miss`` below.
  """
  entry = cache.entry_for(fun, cfg)
  call_slow = _with_placement(entry, fun, lambda j: j)

  def cache_miss(*args, **kwargs):
    frame = _state.frame
    if frame is not None:  # inside an outer pmap's body: become a mesh axis of it
      return program.run_nested(cfg, fun, frame, args, kwargs), None
    if cfg.strict_replication:
      out, flags = call_slow(*args, **kwargs)
      _check_replicated(cfg, out, flags)
      return _as_pmap_outputs(out), None
    if _trace_ctx.trace is not _eval_trace:  # a user's jit / vmap / grad: plain jit
      return call_slow(*args, **kwargs), None
    top = entry.top
    seen = top.__wrapped__.meshes_used
    _, mesh, shardings = program.input_shardings(cfg, fun, args, kwargs, False, seen)
    if mesh is None or len(mesh.axis_names) > 1:  # not known before tracing / nested pmap
      return _as_pmap_outputs(call_slow(*args, **kwargs)), None
    plan = fastpath.Plan(mesh=mesh, in_shardings_flat=tuple(shardings), static_argnums=cfg.static)
    try:
      return fastpath.run(top, args, kwargs, plan)
    except Exception:  # pylint: disable=broad-except
      # Only when tracing just found nested pmaps (the program's mesh has more axes than
      # the one the inputs were placed on) is there something else to try.
      traced_mesh = seen.get(mesh.shape[mesh.axis_names[0]])
      if traced_mesh is None or len(traced_mesh.axis_names) == 1:
        raise
    return _as_pmap_outputs(call_slow(*args, **kwargs)), None

  def checked_cache_miss(*args, **kwargs):
    try:
      return cache_miss(*args, **kwargs)
    except dispatch.InternalFloatingPointError as e:
      # jax_debug_nans / jax_debug_infs found one in an output: legacy's error and wording.
      raise FloatingPointError(
          f"Invalid value ({e.ty}) encountered in parallel computation.") from None

  # One C++ dispatcher per wrapper, as legacy: its ``_cache_size`` (an int property) and
  # ``_cache_clear()`` are per wrapper, while traces and executables are shared per entry.
  pmapped = fastpath.make_dispatcher(fun, checked_cache_miss, cfg.static)
  functools.update_wrapper(pmapped, fun)
  pmapped.lower = _ahead_of_time(entry, fun, "lower")
  pmapped.trace = _ahead_of_time(entry, fun, "trace")
  pmapped._fun = fun
  pmapped._pmap_config = cfg
  return pmapped
