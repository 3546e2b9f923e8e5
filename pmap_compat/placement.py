"""The ``jax.device_put_sharded`` / ``jax.device_put_replicated`` that ``patch()`` restores
where JAX dropped them from its namespace (0.10.0 on).

Both are JAX's own implementations (kept in ``jax._src.api``), which place values exactly
as that JAX's pmap expects them. ``device_put_sharded`` takes each shard's value from an
array on one device only: legacy code stacks values it took from pmap outputs
(``[y[0]] * n`` when restoring a checkpoint, ``unreplicate``), and where legacy's outputs
were ``PmapSharding`` arrays whose ``y[0]`` is a one-device array, this JAX's outputs are
``NamedSharding`` arrays whose ``y[0]`` is replicated over the pmap's devices (and values
computed from them live on all those devices too). So a shard that spans several devices
is first brought onto the device it is destined for, on device (a replicated one is its
shard already there: no copy), and JAX's own function takes it from there.
``device_put_replicated`` already accepts any array (it places ``x`` on one device first).
"""
from __future__ import annotations

from typing import Any
from collections.abc import Sequence

import jax
from jax._src import api as jax_api
from jax._src import core
from jax.sharding import SingleDeviceSharding

__all__ = ["device_put_replicated", "device_put_sharded"]

device_put_replicated = jax_api.device_put_replicated


def _on_one_device(x: Any, device: Any) -> Any:
  """``x``'s value on ``device`` when ``x`` is an array over several devices; else ``x``."""
  if not isinstance(x, jax.Array) or isinstance(x, core.Tracer):
    return x
  sharding = x.sharding
  if len(sharding.device_set) == 1:
    return x
  if sharding.is_fully_replicated:
    # Any of its shards is the value; this process's copy on ``device`` needs no transfer
    # (a multi-process array has no single-device form other than a local shard).
    shards = x.addressable_shards
    return next((s.data for s in shards if s.device == device), shards[0].data)
  return jax.device_put(x, SingleDeviceSharding(device))  # gathered on device


def device_put_sharded(shards: Sequence[Any], devices: Sequence[Any]) -> Any:
  """JAX's ``device_put_sharded``, also for shards that are arrays over several devices
  (see the module docstring); arguments it rejects reach it unchanged, for its errors."""
  if isinstance(shards, Sequence) and len(shards) == len(devices):
    shards = [jax.tree.map(lambda x, d=device: _on_one_device(x, d), shard)
              for shard, device in zip(shards, devices, strict=True)]
  return jax_api.device_put_sharded(shards, devices)
