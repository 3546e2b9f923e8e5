"""What a test program writes differently on the two JAX lines (legacy's API is gone on 0.10).

On jax 0.6.0 these are legacy's own calls. On jax 0.10.2, where they were removed, each
is the 0.10.2 call that gives the same values, so a program recorded under legacy on
0.6.0 still has a meaning (and a reference) there.
"""
from __future__ import annotations

import contextlib
from typing import Any
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from support.jax_lines import on_legacy_line


def enable_x64() -> contextlib.AbstractContextManager:
  return jax.experimental.enable_x64() if on_legacy_line() else jax.enable_x64(True)


def use_mesh(mesh: Mesh) -> contextlib.AbstractContextManager:
  return jax.sharding.use_mesh(mesh) if on_legacy_line() else jax.set_mesh(mesh)


def _stacked(blocks: Sequence[Any], devices: Sequence[Any]) -> jax.Array:
  """The blocks stacked along a new leading axis, block i on devices[i]."""
  mesh = Mesh(np.asarray(devices, dtype=object), ("devices",))
  return jax.device_put(np.stack([np.asarray(b) for b in blocks]), NamedSharding(mesh, P("devices")))


def device_put_replicated(x: Any, devices: Sequence[Any]) -> Any:
  """Legacy's ``jax.device_put_replicated`` (0.10: the same values laid out per device)."""
  if on_legacy_line():
    return jax.device_put_replicated(x, devices)
  return jax.tree.map(lambda leaf: _stacked([leaf] * len(devices), devices), x)


def device_put_sharded(blocks: Sequence[Any], devices: Sequence[Any]) -> Any:
  """Legacy's ``jax.device_put_sharded`` (0.10: the same values laid out per device)."""
  if on_legacy_line():
    return jax.device_put_sharded(blocks, devices)
  return jax.tree.map(lambda *leaves: _stacked(leaves, devices), *blocks)
