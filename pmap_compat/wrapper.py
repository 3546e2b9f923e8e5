"""The callable ``pmap`` returns: legacy's surface around one shared jit per config.

Steady-state calls run in C++: on jax 0.6 jax's C++ pmap call cache runs our compiled
jit(shard_map) executable (``fastpath``), on jax 0.10 a C++ call cache of jit's kind
does (``jit_dispatch``). A call neither can serve comes to ``cache_miss``, which
handles nested calls, calls under a user's trace, strict replication checks and first
calls; the plain-jit slow path moves committed inputs onto the program's devices before
tracing (``_move_committed``).
"""
from __future__ import annotations

import functools
from typing import Any
from collections.abc import Callable

import jax
import numpy as np
from jax._src import core, dispatch
from jax._src.interpreters import partial_eval as pe
from jax.tree_util import (keystr, tree_flatten, tree_flatten_with_path, tree_leaves,
                           tree_unflatten)

from pmap_compat import axes as axes_lib
from pmap_compat import aot, arguments, cache, errors, inputs, jax_line, jit_dispatch, meshes
from pmap_compat import nesting
from pmap_compat import outputs
from pmap_compat import program
from pmap_compat.config import PmapConfig

if jax_line.LEGACY_PMAP_RUNTIME:
  from pmap_compat import fastpath

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


def _committed(x: Any) -> bool:
  """A concrete array jit will not move by itself."""
  return isinstance(x, jax.Array) and not isinstance(x, core.Tracer) and x.committed


# How a committed input reaches the program's devices before jit sees it. jax 0.6: placed on
# the program's mesh. jax 0.10's jit keys its traces on the abstract mesh an input's aval
# carries, so there it keeps its aval wherever that can be done on device (a call after
# the trace that found the mesh is then not traced again).
_move_committed = (inputs.place if jax_line.LEGACY_PMAP_RUNTIME
                   else jit_dispatch.onto_devices_keeping_aval)


def _place_inputs(entry: cache.Entry, staged: cache.Program, spread: bool, args: tuple,
                  kwargs: dict, committed_only: bool) -> tuple[tuple, dict] | None:
  """The call with its committed dynamic leaves (all of them unless ``committed_only``)
  on the program's devices; None when nothing moved or the mesh is not known before
  tracing."""
  try:
    call, mesh, shardings = program.input_shardings(entry.cfg, entry.fun_ref(), args, kwargs,
                                                    spread, staged.meshes)
    if mesh is None:
      return None
    moved = [_move_committed(x, s) if _committed(x) else x
             for x, s in zip(call.leaves, shardings, strict=True)]
    if not committed_only:
      moved = inputs.place_leaves(moved, shardings) or moved
  except Exception:  # pylint: disable=broad-except
    return None  # the inputs themselves are the problem: jit's own error says it best
  if all(m is x for m, x in zip(moved, call.leaves, strict=True)):
    return None
  return call.rebuild(moved)


class _PlacedCall:
  """``method(jitted)(*args, **kwargs)`` with committed inputs moved onto the program's
  devices first (``_move_committed``).

  When tracing finds nested pmaps, the program's mesh is only known afterwards, and jit
  refuses inputs on other devices: then, and only then, the call runs again with the
  inputs moved (the trace itself succeeded, so the user's function is not re-run).

  Owns ``fun``: the shared entry only holds it weakly, and ``pmap(f).lower`` must keep
  working after the wrapper itself is gone.
  """

  __slots__ = ("_entry", "_fun", "_method")

  def __init__(self, entry: cache.Entry, fun: Callable, method: Callable[[Any], Callable]):
    self._entry, self._fun, self._method = entry, fun, method

  def __call__(self, *args, **kwargs):
    if _state.frame is not None:
      raise TypeError("pmap .lower()/.trace() cannot be used inside another pmap's body")
    entry = self._entry
    spread = (_trace_ctx.trace is not _eval_trace and _under_jit()
              and meshes.may_spread(tree_leaves((args, kwargs)), entry.cfg.backend))
    staged = entry.program(spread)
    target = self._method(staged.jitted)
    if any(map(_committed, tree_leaves((args, kwargs)))):
      args, kwargs = _place_inputs(entry, staged, spread, args, kwargs, True) or (args, kwargs)
    try:
      return target(*args, **kwargs)
    except ValueError as err:
      if not jit_dispatch.inputs_on_other_devices(err):
        raise
      # Tracing has just chosen the program's mesh (nested pmaps): move the inputs there.
      placed = (_place_inputs(entry, staged, spread, args, kwargs, True)
                or _place_inputs(entry, staged, spread, args, kwargs, False))
      if placed is None:
        raise
    return target(*placed[0], **placed[1])


def _ahead_of_time(entry: cache.Entry, fun: Callable, method: str) -> Callable:
  """``.lower`` / ``.trace``: jit's, on host-local arguments in a multi-process job."""
  local = _PlacedCall(entry, fun, lambda j: getattr(j, method))

  def stage(*args, **kwargs):
    if program.local_size_is_global():
      return aot.as_pmap_stage(local(*args, **kwargs), entry.info.name)
    return aot.stage_multiprocess(method, entry.top.jitted, entry.top.meshes, entry.cfg, fun,
                                  entry.info.name, args, kwargs)
  return stage


def _check_replicated(cfg: PmapConfig, out: Any, flags: tuple) -> None:
  if not flags or isinstance(flags[0], core.Tracer):
    return  # only checkable once values exist; under a trace the flags are abstract
  varied = [bool(np.asarray(f)) for f in flags]
  if any(varied):
    out_axes = axes_lib.out_axes_per_leaf(cfg.out_axes, out)
    paths = [keystr(p) or "<output>"
             for (p, _), d in zip(tree_flatten_with_path(out)[0], out_axes, strict=True)
             if d is None]
    raise errors.replicated_output_varies([p for p, v in zip(paths, varied, strict=True) if v])


def _as_pmap_outputs(out: Any) -> Any:
  """Top-level slow-path results in pmap's representation (``outputs``; same buffers)."""
  leaves, tree = tree_flatten(out)
  return tree_unflatten(tree, outputs.wrap_outputs(leaves))


def _worded_as_legacy(call: Callable, cfg: PmapConfig, args: tuple, kwargs: dict) -> Any:
  """``call(*args, **kwargs)`` off the top-level path, its errors worded as legacy's: too
  many devices names the user's jit being staged; an argument jit cannot interpret is
  named by legacy's type check."""
  try:
    return call(*args, **kwargs)
  except errors.TooManyDevices as err:
    raise err.in_jit() from None
  except TypeError as err:
    if errors.jit_refused_argument(err):
      dynamic, _ = arguments.split_static(args, cfg.static)
      errors.check_jax_types(tree_leaves((dynamic, kwargs)))
    raise


def make_wrapper(fun: Callable, cfg: PmapConfig) -> Callable:
  """The object ``pmap`` returns: a C++ call cache in front of our programs.

  On a signature it has seen, the C++ dispatcher (jax 0.6: ``fastpath``; jax 0.10: one of
  jit's kind, ``jit_dispatch``) runs our compiled jit(shard_map) executable without
  entering our Python. Everything else lands in ``cache_miss`` below.
  """
  entry = cache.entry_for(fun, cfg)
  call_slow = _PlacedCall(entry, fun, lambda j: j)
  if jax_line.LEGACY_PMAP_RUNTIME:
    run = fastpath.run
  else:
    run = jit_dispatch.run

  def cache_miss(*args, **kwargs):
    frame = _state.frame
    if frame is not None:  # inside an outer pmap's body: become a mesh axis of it
      return program.run_nested(cfg, fun, frame, args, kwargs), None
    if cfg.strict_replication:
      out, flags = _worded_as_legacy(call_slow, cfg, args, kwargs)
      _check_replicated(cfg, out, flags)
      return _as_pmap_outputs(out), None
    if _trace_ctx.trace is not _eval_trace:  # a user's jit / vmap / grad: plain jit
      return _worded_as_legacy(call_slow, cfg, args, kwargs), None
    top = entry.top
    _, mesh, shardings = program.input_shardings(cfg, fun, args, kwargs, False, top.meshes)
    if mesh is None or len(mesh.axis_names) > 1:  # not known before tracing / nested pmap
      return _as_pmap_outputs(call_slow(*args, **kwargs)), None
    plan = inputs.Plan(mesh=mesh, in_shardings_flat=tuple(shardings), static_argnums=cfg.static)
    try:
      return run(top.jitted, args, kwargs, plan)
    except ValueError as err:
      # Tracing just found nested pmaps: the program's mesh has more devices than the one
      # the inputs were placed on. The slow path places them on the traced mesh.
      traced_mesh = top.meshes.get(mesh.shape[mesh.axis_names[0]])
      if (not jit_dispatch.inputs_on_other_devices(err) or traced_mesh is None
          or len(traced_mesh.axis_names) == 1):
        raise
    return _as_pmap_outputs(call_slow(*args, **kwargs)), None

  def checked_cache_miss(*args, **kwargs):
    try:
      return cache_miss(*args, **kwargs)
    except dispatch.InternalFloatingPointError as e:
      # jax_debug_nans / jax_debug_infs found one in an output: legacy's error and wording.
      raise errors.invalid_value(e.ty) from None

  pmapped: Any
  if jax_line.LEGACY_PMAP_RUNTIME:
    # One C++ dispatcher per wrapper, as legacy: its ``_cache_size`` (an int property) and
    # ``_cache_clear()`` are per wrapper, while traces and executables are shared per entry.
    pmapped = fastpath.make_dispatcher(fun, checked_cache_miss, cfg.static)
  else:
    pmapped = jit_dispatch.PmapFunction(entry.top.jitted, checked_cache_miss,
                                        lambda a, k: program.on_program_mesh(
                                            cfg, fun, a, k, entry.top.meshes),
                                        strict=cfg.strict_replication,
                                        static_argnums=cfg.static)
  functools.update_wrapper(pmapped, fun)
  pmapped.lower = _ahead_of_time(entry, fun, "lower")
  pmapped.trace = _ahead_of_time(entry, fun, "trace")
  pmapped._fun = fun
  pmapped._pmap_config = cfg
  return pmapped
