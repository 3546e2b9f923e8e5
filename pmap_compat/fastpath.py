"""Steady-state dispatch at legacy speed on jax 0.6: the C++ pmap dispatcher driving our
compiled jit(shard_map) executable. (jax 0.10 has no such dispatcher: ``jit_dispatch``.)

``jax._src.lib.pmap_lib.pmap`` is only a C++ call cache: on a signature it has
seen it flattens the arguments, passes ``PmapSharding`` arrays whose blocks match
straight to an executable, hands every other leaf to a Python fallback, runs the
executable and builds ``PmapSharding`` results; on anything new it calls back
into Python (``cache_miss``), which returns the results and, optionally, the data
to serve that signature from C++ next time. We feed it executables compiled by
``jax.jit`` from ``shard_map_impl.shard_map`` programs; none of legacy pmap's
tracing or lowering is involved. An SPMD executable over mesh devices
``d0..dn`` reads and writes exactly the per-device ``(1, ...)`` blocks that the
equivalent ``PmapSharding`` describes, which is what makes this sound; every
sharding we hand to C++ is checked block by block first (blocks.same_blocks).

``run`` is the slow path (first call per signature, and every call that is not
eligible for C++): place inputs on device, compile (cached), execute, convert the
results, and describe the fast path when it applies.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple
from collections.abc import Callable, Sequence

from jax._src import api as _jax_api
from jax._src import config
from jax._src import dtypes
from jax._src import pjit
from jax._src import tree_util
from jax._src import util
from jax._src.array import ArrayImpl
from jax._src.interpreters import mlir, pxla
from jax._src.lib import pmap_lib

from pmap_compat import aot, arguments, inputs, jax_line, meshes, multihost, outputs
from pmap_compat.inputs import Plan

__all__ = ["Executable", "make_dispatcher", "run", "compiled_for"]


def make_dispatcher(fun: Callable, cache_miss: Callable, static_argnums: Sequence[int]) -> Any:
  """The C++ dispatcher; ``cache_miss(*args, **kwargs) -> (outs, fastpath_or_None)``.

  Registered with jax.clear_caches(), as legacy pmap's dispatchers are."""
  dispatcher = pmap_lib.pmap(fun, cache_miss, tuple(static_argnums), inputs.shard_arg_fallback,
                             pytree_registry=tree_util.default_registry)
  _jax_api._pmap_cache_clears.add(dispatcher)
  return dispatcher


_MAX_EXECUTABLES_PER_PROGRAM = 64


@functools.partial(util.weakref_lru_cache, maxsize=4096, trace_context_in_key=False)
def _executables(jitted: Callable) -> dict:
  """The executable table of one jitted program, dropped with the program (and so with the
  user's function, which cache.py holds weakly: a loop of fresh pmap(lambda ...) must not
  grow) and by jax.clear_caches()."""
  return {}


class Executable(NamedTuple):
  """One compiled program: jit's executable for the flat leaves, and its output tree."""
  executable: Any  # pxla.MeshExecutable
  out_tree: Any


def compiled_for(jitted: Callable, args: tuple, kwargs: dict,
                 static: dict) -> Executable:
  """What ``jitted`` compiles for this call, cached on what determines it: the placed
  leaves' types and shardings, the tree, the static arguments and the tracing context
  (x64, mesh contexts, ...)."""
  leaves, tree = tree_util.tree_flatten(
      ([a for i, a in enumerate(args) if i not in static], kwargs))
  sig = tuple(map(_signature, leaves))
  key = (tree, tuple(sorted(static.items())), sig, config.trace_context())
  per_program = _executables(jitted)
  executable = per_program.get(key)
  if executable is None:
    if len(per_program) >= _MAX_EXECUTABLES_PER_PROGRAM:
      del per_program[next(iter(per_program))]  # the oldest signature
    executable = per_program[key] = _compile(jitted, args, kwargs)
  return executable


def _signature(x: Any) -> tuple:
  """A placed leaf's part of the cache key. float0 leaves stay numpy arrays (no device
  buffer holds them): never weakly typed, on no sharding."""
  aval = getattr(x, "aval", None)
  return (x.shape, x.dtype, aval is not None and aval.weak_type, getattr(x, "sharding", None))


def _compile(jitted: Any, args: tuple, kwargs: dict) -> Executable:
  """jit's trace, lower and compile of this call, as ``jitted.lower(...).compile()`` but
  without the stage objects: those carry a tree of ``ArgInfo`` placeholders in the shape
  of the user's arguments, and building it calls the constructors of the user's pytree
  nodes with placeholders, which a node that converts its fields (``jnp.uint32(x)``)
  rejects. Only flat leaves and treedefs are handled here. The trace is jit's own (its
  caches and donation); the program is named as legacy named its programs."""
  params, args_flat = jax_line.infer_jit_params(jitted._fun, jitted._jit_info, args, kwargs)
  try:
    lowering = pjit._resolve_and_lower(jax_line.lowering_args(args_flat), **params.params,
                                       pgle_profiler=None,
                                       lowering_platforms=None,
                                       lowering_parameters=mlir.LoweringParameters())
  except jax_line.DeviceAssignmentMismatchError as err:
    # jit's own error for committed inputs on other devices (the wrapper reads it there).
    fails, = err.args
    raise ValueError(jax_line.device_assignment_mismatch_error(
        params.params["name"], fails, args_flat, "jit", params.arg_names)) from None
  aot.name_like_legacy(lowering.stablehlo(), params.params["name"])
  return Executable(lowering.compile(), params.out_tree)


def _is_extended(x: Any) -> bool:
  return dtypes.issubdtype(getattr(x, "dtype", None), dtypes.extended)


def _fastpath_data(executable: Any, leaves: list, in_shardings: Sequence[Any],
                   outs: list, out_tree: Any) -> Any:
  """The C++ dispatcher's description of this call, or None when it cannot be
  served from C++ (effects, callbacks, typed keys, pruned inputs, layouts)."""
  call = executable.unsafe_call
  if not (isinstance(call, pxla.ExecuteReplicated) and not call.ordered_effects
          and not call.has_unordered_effects and not call.has_host_callbacks):
    return None
  if len(executable._kept_var_idx) != len(leaves):
    return None
  if any(l is not None for l in executable._dispatch_in_layouts):
    return None
  if any(map(_is_extended, leaves)) or any(map(_is_extended, outs)):
    return None
  if config.debug_nans.value or config.debug_infs.value:
    return None
  maybe_pmap = [outputs.named_to_pmap(s, x.ndim)
                for s, x in zip(in_shardings, leaves, strict=True)]
  in_pmap = [p for p in maybe_pmap if p is not None]
  if len(in_pmap) != len(maybe_pmap) or not all(type(o) is ArrayImpl for o in outs):
    return None
  out_pmap = [o.sharding for o in outs]
  if not all(isinstance(s, outputs.PmapSharding) for s in out_pmap):
    return None
  if not in_shardings and not outs:
    return None  # nothing to tell the devices from; such calls are rare and cheap
  devices = list(in_shardings[0]._device_assignment) if in_shardings else list(
      outs[0].sharding._device_assignment)
  return _jax_api._PmapFastpathData(
      version=1,
      xla_executable=executable.xla_executable,
      in_handler=call.in_handler,
      out_handler=call.out_handler,
      out_pytree_def=out_tree,
      input_devices=devices,
      # One index per device for each argument (JAX annotates this field as one Index).
      input_indices=[tuple(p.devices_indices_map(x.shape).values())  # type: ignore[arg-type]
                     for p, x in zip(in_pmap, leaves, strict=True)],
      input_array_shardings=in_pmap,
      out_avals=[o.aval for o in outs],
      out_array_shardings=out_pmap,
      out_committed=[True] * len(outs),
  )


def run(jitted: Callable, args: tuple, kwargs: dict, plan: Plan) -> tuple[Any, Any]:
  """Slow path of one call: returns ``(outputs, fastpath_data_or_None)``.

  The inputs are placed in the caller's context, as the C++ dispatcher places those of
  later calls (the programs that slice them are cached under it); the program is traced
  without an ambient mesh."""
  dynamic, static = arguments.split_static(args, plan.static_argnums)
  leaves, in_tree = tree_util.tree_flatten((tuple(dynamic), kwargs))
  targets = plan.in_shardings_flat
  multiprocess = multihost.is_multiprocess()
  if multiprocess:
    placed = multihost.local_to_global(leaves, targets)
  else:
    placed = inputs.place_leaves(leaves, targets) or leaves
  with meshes.no_ambient_mesh():
    return _run(jitted, placed, in_tree, static, targets, multiprocess)


def _run(jitted: Callable, placed: list, in_tree: Any, static: dict, targets: Sequence[Any],
         multiprocess: bool) -> tuple[Any, Any]:
  dyn_placed, kw_placed = tree_util.tree_unflatten(in_tree, placed)
  call_args = arguments.merge_static(dyn_placed, static)
  compiled = compiled_for(jitted, call_args, kw_placed, static)
  executable = compiled.executable
  out_flat = list(executable.unsafe_call(*placed))
  if multiprocess:
    # No C++ fast path: it would hand each process's host-local arrays to the global
    # executable, and from jaxlib 0.6.2 the runtime refuses arrays whose device list is
    # not the executable's ("CopyArrays only supports destination device list of the same
    # size"); every call converts local <-> global in Python instead.
    result = multihost.global_to_local(out_flat)
    fast = None
  else:
    result = outputs.wrap_outputs(out_flat)
    fast = _fastpath_data(executable, placed, targets, result, compiled.out_tree)
  return tree_util.tree_unflatten(compiled.out_tree, result), fast
