"""Steady-state dispatch on jax 0.10: straight into a C++ call cache of jit's kind.

jax 0.10 removed the C++ pmap dispatcher that ``fastpath`` drives on jax 0.6. Here the
callable ``pmap`` returns owns a C++ call cache built like ``jax.jit``'s
(``jax_line.jit_call_cache``) in front of the shared ``jax.jit`` of the staged program.
On a signature it has seen (tree, avals, shardings, static arguments, trace state), C++
transfers numpy and uncommitted inputs, runs the executable and returns its results: the
NamedSharding arrays (spec ``P(axis_name)`` over the pmap's mesh) that 0.10.2's own
``jax.pmap`` returns, fed back with no copy. Static arguments are hashed and compared in
C++ as jit's own. Our Python work per call is one check of ``jax_debug_nans`` /
``jax_debug_infs``, which that cache cannot see.

Everything else reaches Python through the cache's miss handler (``_Miss``): a new
signature runs through jit's own cache miss, which hands the executable to C++ for next
time. Calls inside another pmap's body or under a user's trace (their tracers or trace
state never match a cached signature), strict replication checks, NaN / Inf checks,
multi-process jobs (host-local arguments become global ones and results host-local
again: ``run``), and inputs committed to devices outside the program's mesh, which jit
refuses and we move on device first, go to the wrapper's ``cache_miss`` and are never
served from C++.
"""
from __future__ import annotations

import types
from typing import Any
from collections.abc import Callable

import jax
import numpy as np
from jax._src import config, core, dispatch, dtypes
from jax._src import tree_util
from jax._src.array import ArrayImpl
from jax.sharding import Mesh, NamedSharding

from pmap_compat import arguments, errors, inputs, jax_line, meshes, multihost, nesting
from pmap_compat.jax_line import DeviceAssignmentMismatchError

__all__ = ["PmapFunction", "inputs_on_other_devices", "onto_devices_keeping_aval", "run"]

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
  return errors.jit_refused_argument(err)


class _Miss:
  """What the C++ call cache runs for a signature it cannot serve (see module docstring):
  ``(outputs, fastpath_data, rebuild)``, with fast-path data only for plain top-level
  calls."""

  __slots__ = ("_jit_miss", "_cache_miss", "_align", "_strict", "_direct")

  def __init__(self, jitted: Any, cache_miss: Callable[..., tuple[Any, Any]],
               align: Callable[[tuple, dict], tuple[tuple, dict, bool] | None], strict: bool):
    self._jit_miss = jax_line.jit_cache_miss(jitted)
    self._cache_miss = cache_miss
    self._align = align  # inputs onto the program's shardings (program.on_program_mesh)
    self._strict = strict  # strict replication: every call needs our Python
    # Decided at the first call: pmap may be applied before jax.distributed.initialize,
    # but once a computation has run the process count is fixed.
    self._direct: bool | None = None

  def __call__(self, *args, **kwargs):
    direct = self._direct
    if direct is None:
      direct = self._direct = not self._strict and not multihost.is_multiprocess()
    if direct and _state.frame is None and _trace_ctx.trace is _eval_trace:
      try:
        aligned = self._align(args, kwargs)
        if aligned is None:
          return self._jit_miss(*args, **kwargs)
        placed_args, placed_kwargs, servable = aligned
        result = self._jit_miss(*placed_args, **placed_kwargs)
        # C++ caches the executable under this call's own signature; where it would hand
        # the executable committed inputs as they came, on another layout, it must not.
        return result if servable else jax_line.served_by_python(result[0])
      except (ValueError, TypeError) as err:
        if not _for_the_slow_path(err):
          raise  # e.g. the user's own error while tracing: not run a second time
    return jax_line.served_by_python(self._cache_miss(*args, **kwargs)[0])


class PmapFunction:
  """What ``pmap`` returns on jax 0.10: a C++ call cache, entered after one check.

  ``_cache_size`` / ``_cache_clear()`` are those of that call cache, which the wrappers of
  one function with one configuration share (as they share jit's traces).
  """
  # Slots: ``functools.update_wrapper`` copies the wrapped function's ``__dict__`` into
  # ours, and that function may itself be a PmapFunction (nested pmaps).
  __slots__ = ("_call", "_cache_miss", "__dict__", "__weakref__")

  def __init__(self, jitted: Any, cache_miss: Callable[..., tuple[Any, Any]],
               align: Callable[[tuple, dict], tuple[tuple, dict, bool] | None], strict: bool,
               static_argnums: tuple[int, ...]):
    self._cache_miss = cache_miss
    staged = jax_line.jitted_function(jitted)
    self._call = jax_line.jit_call_cache(
        getattr(staged, "__name__", "pmap"), staged, _Miss(jitted, cache_miss, align, strict),
        static_argnums)

  def __call__(self, *args, **kwargs):
    if _debug_nans.value or _debug_infs.value:
      return self._cache_miss(*args, **kwargs)[0]
    return self._call(*args, **kwargs)

  def __get__(self, instance: Any, owner: Any = None) -> Any:
    # Stored on a class it is a method, as legacy's C++ PmapFunction and any function:
    # ``obj.f(x)`` passes ``obj`` first (e.g. static_broadcasted_argnums=(0,) on ``self``).
    if instance is None:
      return self
    return types.MethodType(self, instance)

  @property
  def _cache_size(self) -> int:
    return self._call._cache_size()

  def _cache_clear(self) -> None:
    self._call._clear_cache()


def onto_devices_keeping_aval(x: Any, target: NamedSharding) -> Any:
  """A committed input for a program whose inputs ``target`` describes, with ``x``'s own
  aval wherever that can be done on device: jax 0.10's jit keys its traces on the
  abstract mesh an aval carries (a host value's and a one-device array's: none), so a
  program traced for ``x`` as it came is not traced again.

  A one-device array is handed over uncommitted, the same buffer (jit slices it on its
  device). An array over the program's devices in another order keeps its mesh's axes,
  now over the program's device order (shards permuted on device; jit reshards it
  inside the program). Anything else is placed on ``target`` (``inputs.place``).
  """
  if type(x) is ArrayImpl and not dtypes.issubdtype(x.dtype, dtypes.extended):
    sharding = x.sharding
    if len(sharding.device_set) == 1:
      return ArrayImpl(x.aval, sharding, x._arrays, committed=False)
    devices = list(target._device_assignment)
    if isinstance(sharding, NamedSharding) and sharding.device_set == set(devices):
      if list(sharding._device_assignment) == devices:
        return x
      mesh = sharding.mesh
      reordered = Mesh(np.array(devices, dtype=object).reshape(mesh.devices.shape),
                       mesh.axis_names, axis_types=mesh.axis_types)
      return jax.device_put(x, NamedSharding(reordered, sharding.spec,
                                             memory_kind=sharding.memory_kind))
  return inputs.place(x, target)


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

