"""Input placement: turn anything legacy ``jax.pmap`` accepts into an array with
exactly the sharding the compiled program expects, moving data only on device.

Cases, cheapest first (each leaf independently):

* already placed (our outputs, legacy pmap outputs and ``device_put_replicated``/
  ``device_put_sharded`` results whose blocks sit on the right devices): the same
  buffers under the target sharding object, no copy;
* host values (numpy, Python and numpy scalars): one implicit host-to-device
  transfer, exactly what legacy does (so ``jax.transfer_guard`` applies);
* a single-device array (committed or not): sliced on its device, blocks copied
  device to device;
* a multi-device array on the target's devices but laid out differently (another
  mesh, other device order, replicated vs mapped): one XLA reshard program
  (collectives), never a host round trip;
* a multi-device array on other devices: gathered on its own devices, then
  handled as a single-device array.

``shard_arg_fallback`` is what the C++ dispatcher calls for a leaf it cannot pass
through as is; ``place`` is the general entry point for the slow path.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable, Sequence

import dataclasses

import jax
from jax._src import core
from jax._src import dtypes
from jax._src import util
from jax._src.array import ArrayImpl
from jax._src.interpreters import pxla
from jax._src.mesh import Mesh
from jax._src.sharding_impls import GSPMDSharding, NamedSharding

from pmap_compat import blocks, errors, jax_line, outputs
from pmap_compat.jax_line import PmapSharding, prng

__all__ = ["Plan", "onto_program_shardings", "place", "place_leaves", "shard_arg_fallback"]


@dataclasses.dataclass(frozen=True)
class Plan:
  """Where a top-level call's inputs go, as the wrapper knows it at a cache miss.

  ``in_shardings_flat`` has one NamedSharding per leaf of
  ``tree_flatten((dynamic_args, kwargs))`` (static positional args removed), over
  ``mesh`` (the GLOBAL mesh in a multi-process job).
  """
  mesh: Mesh
  in_shardings_flat: tuple
  static_argnums: tuple = ()


@util.cache(max_size=256, trace_context_in_key=False)
def _reshard_program(target: Any) -> Any:
  """A jit that reshards its input to ``target`` on device (cached; jax.clear_caches()
  empties the cache)."""
  return jax.jit(lambda a: a, out_shardings=target)


def _rewrap(x: ArrayImpl, target: Any) -> ArrayImpl:
  """``x``'s buffers under ``target`` (caller checked the blocks coincide)."""
  return ArrayImpl(x.aval, target, x._arrays, committed=True)


def _jit_visible(x: ArrayImpl) -> ArrayImpl:
  """``x`` with a sharding jit takes as it is (jit reshards PmapSharding inputs
  through the host); same buffers."""
  if not isinstance(x.sharding, PmapSharding):
    return x
  named = outputs.named_of_pmap_cached(x.sharding, x.shape)
  if named is None:
    raise NotImplementedError(f"pmap_compat: cannot reshard an input with {x.sharding}")
  return _rewrap(x, named)


def _one_device_copy(x: ArrayImpl) -> ArrayImpl:
  """A single-device array holding all of ``x``, computed on ``x``'s devices."""
  if x.is_fully_replicated:
    return x._arrays[0]
  src = _jit_visible(x)
  devices = tuple(src.sharding._device_assignment)
  replicated = GSPMDSharding.get_replicated(devices)
  return _reshard_program(replicated)(src)._arrays[0]


def _single_device(x: Any) -> bool:
  return (type(x) is ArrayImpl and len(x.sharding.device_set) == 1
          and not dtypes.issubdtype(x.dtype, dtypes.extended))


def _upload(x: Any, target: Any) -> Any:
  """A host value on ``target`` through the implicit transfer jit's dispatch makes.

  ``jax.device_put`` counts as an explicit transfer, which
  ``transfer_guard("disallow")`` lets through; legacy pmap and jit move host
  arguments implicitly, so the guard must see this upload the same way.
  """
  try:
    value = jax_line.canonicalize_value(x)
  except (TypeError, ValueError):
    value = None  # not a JAX value: device_put raises its usual error for it
  if (type(value) not in pxla.shard_arg_handlers or type(value) is ArrayImpl
      or getattr(value, "dtype", None) == dtypes.float0):
    return jax.device_put(x, target)  # nothing jit's dispatch would upload itself
  placed = pxla.shard_args([target], [None], [None], [value], canonicalize=False)[0]
  aval = core.shaped_abstractify(x)  # keeps a Python scalar's weak type, as jit's signature does
  if aval.weak_type and not placed.aval.weak_type:
    placed = ArrayImpl(aval, placed.sharding, placed._arrays, committed=True)
  return placed


def place(x: Any, target: Any) -> Any:
  """``x`` as a committed array with sharding ``target``; data moves only on device
  (host values are transferred once, implicitly, as legacy does)."""
  if isinstance(target, PmapSharding):
    if not isinstance(x, jax.Array) or _single_device(x):
      # JAX's own sharding of host values / one-device arrays (what legacy pmap
      # does here): a host transfer for host values, on-device slices otherwise.
      return pxla.shard_args([target], [None], [None], [x])[0]
    named = outputs.named_of_pmap_cached(target, x.shape)
    if named is not None:
      return outputs.as_pmap_array(place(x, named))
  if not isinstance(x, jax.Array):
    try:
      return _upload(x, target)
    except Exception:  # pylint: disable=broad-except  # jax 0.6 raises a non-TypeError for str
      errors.check_jax_types([x])  # legacy's error names the argument (object dtype, str)
      raise
  sharding = x.sharding
  if sharding == target and not isinstance(sharding, PmapSharding):
    return x
  if isinstance(x, prng.PRNGKeyArray) and isinstance(target, NamedSharding):
    # Typed keys: place their uint32 storage (trailing key dims stay unsharded
    # under the same spec) and wrap it again; nothing is computed.
    base = place(x._base_array, target)
    return x if base is x._base_array else prng.PRNGKeyArray(x._impl, base)
  if type(x) is not ArrayImpl or dtypes.issubdtype(x.dtype, dtypes.extended):
    return jax.device_put(x, target)
  x._check_if_deleted()
  if blocks.same_blocks(sharding, target, x.shape, ordered=False):
    return _rewrap(x, target)
  if len(sharding.device_set) == 1:
    twin = outputs.named_to_pmap(target, x.ndim)
    if twin is not None:
      # Sliced as legacy pmap and the C++ dispatcher slice it (one program per shape),
      # so the call placed here compiles what the dispatched ones reuse.
      return _rewrap(pxla.shard_args([twin], [None], [None], [x])[0], target)
    return jax.device_put(x, target)  # slices on x's device, copies device to device
  if sharding.device_set == target.device_set and not isinstance(target, PmapSharding):
    src = _jit_visible(x)
    if list(src.sharding._device_assignment) == list(target._device_assignment):
      return _reshard_program(target)(src)
    if isinstance(src.sharding, NamedSharding) and isinstance(target, NamedSharding):
      return jax.device_put(src, target)  # permutes shards, then reshards, on device
  return jax.device_put(_one_device_copy(x), target)


def place_leaves(leaves: Sequence[Any], targets: Sequence[Any],
                 select: Callable[[Any], bool] | None = None) -> list | None:
  """``place`` for each leaf (``select``ed ones only, when given); a tracer gets a
  ``jax.device_put`` (a sharding constraint in a trace). None when every leaf was already
  in place, so callers can keep their original arguments."""
  placed = [x if select is not None and not select(x)
            else jax.device_put(x, s) if isinstance(x, core.Tracer) else place(x, s)
            for x, s in zip(leaves, targets, strict=True)]
  return None if all(p is x for p, x in zip(placed, leaves, strict=True)) else placed


def onto_program_shardings(leaves: Sequence[Any],
                           targets: Sequence[Any]) -> tuple[list | None, bool]:
  """Every leaf not already on its program sharding placed there (``place``), and whether
  the C++ call cache may serve the call's signature from then on; ``(None, True)`` when
  every leaf was in place.

  jit keys its traces and programs on its inputs' layout, legacy pmap on shapes and dtypes:
  handed over as they came, a first step fed from the host, by ``device_put_replicated``
  or by another pmap's outputs and the steps fed by its own outputs would compile the step
  once per layout. Placed, they all reach jit on the program's sharding. Only leaves that
  are not there pay (a sharding comparison for the rest).

  C++ moves host values and uncommitted one-device arrays onto the executable's input
  shardings itself, as we do; committed arrays it hands over as they are, so a call that
  moved one of those must keep coming to Python.
  """
  moved: list = []
  servable = True
  for x, t in zip(leaves, targets, strict=True):
    if isinstance(x, jax.Array):
      if isinstance(x, core.Tracer) or x.sharding == t or x.is_deleted():
        moved.append(x)  # in place; a deleted array gets jit's own error
        continue
      servable = servable and not x.committed
    moved.append(_rewrap(x, t) if _same_blocks_other_mesh(x, t) else place(x, t))
  if all(m is x for m, x in zip(moved, leaves, strict=True)):
    return None, True
  return moved, servable


def committed_on_mesh(x: Any) -> bool:
  """A committed array of a standard dtype over a mesh of several devices."""
  return (type(x) is ArrayImpl and x._committed and isinstance(x.sharding, NamedSharding)
          and len(x.sharding.device_set) > 1 and not dtypes.issubdtype(x.dtype, dtypes.extended))


def _same_blocks_other_mesh(x: Any, target: Any) -> bool:
  return (committed_on_mesh(x) and x.sharding != target and not x.is_deleted()
          and blocks.same_blocks(x.sharding, target, x.shape, ordered=True))


def shard_arg_fallback(x: Any, target: PmapSharding) -> Any:
  """Called by the C++ dispatcher for a leaf it cannot pass through unchanged."""
  return place(x, target)
