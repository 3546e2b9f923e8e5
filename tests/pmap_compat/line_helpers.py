"""What a test program writes differently across JAX releases (legacy's API went in 0.10).

Each helper asks the running JAX what it has. Where legacy pmap exists these are legacy's
own calls (``device_put_replicated`` / ``_sharded`` made as legacy makes them, with the
merge flag off on 0.8–0.9: ``PmapSharding`` values). Where it was removed, each is the
call that gives the same values, so a program recorded under legacy on 0.6.0 still has a
meaning (and a reference) there.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from support.legacy_pmap import has_legacy_pmap, legacy_on


def enable_x64() -> contextlib.AbstractContextManager:
  if hasattr(jax, "enable_x64"):  # a config state from 0.8 (jax.experimental's went in 0.9)
    return jax.enable_x64(True)
  return jax.experimental.enable_x64()


def use_mesh(mesh: Mesh) -> contextlib.AbstractContextManager:
  if hasattr(jax, "set_mesh"):  # from 0.7
    return jax.set_mesh(mesh)
  return jax.sharding.use_mesh(mesh)


def _stacked(blocks: Sequence[Any], devices: Sequence[Any]) -> jax.Array:
  """The blocks stacked along a new leading axis, block i on devices[i]."""
  mesh = Mesh(np.asarray(devices, dtype=object), ("devices",))
  return jax.device_put(np.stack([np.asarray(b) for b in blocks]), NamedSharding(mesh, P("devices")))


def _legacy_call(name: str, *args: Any) -> Any:
  """Legacy's ``jax.<name>(*args)``: its kind of value (the merge flag off), and without the
  DeprecationWarning 0.8–0.9 give for this very call."""
  with legacy_on(), warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=rf"jax\.{name} is deprecated",
                            category=DeprecationWarning)
    function: Callable[..., Any] = getattr(jax, name)
    return function(*args)


def device_put_replicated(x: Any, devices: Sequence[Any]) -> Any:
  """Legacy's ``jax.device_put_replicated`` (without legacy pmap: the same values laid out
  per device)."""
  if has_legacy_pmap():
    return _legacy_call("device_put_replicated", x, devices)
  return jax.tree.map(lambda leaf: _stacked([leaf] * len(devices), devices), x)


def device_put_sharded(blocks: Sequence[Any], devices: Sequence[Any]) -> Any:
  """Legacy's ``jax.device_put_sharded`` (without legacy pmap: the same values laid out
  per device)."""
  if has_legacy_pmap():
    return _legacy_call("device_put_sharded", blocks, devices)
  return jax.tree.map(lambda *leaves: _stacked(leaves, devices), *blocks)
