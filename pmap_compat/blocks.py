"""Which block of an array each device holds, compared between shardings."""
from __future__ import annotations

from typing import Any


def spec_entry_axes(entry: Any) -> tuple:
  """The mesh axes a PartitionSpec entry splits one array dimension over."""
  if entry is None:
    return ()
  return tuple(entry) if isinstance(entry, tuple) else (entry,)


def _block_map(sharding: Any, shape: tuple) -> dict:
  return {d: tuple((s.start, s.stop, s.step) for s in idx)
          for d, idx in sharding.devices_indices_map(shape).items()}


def same_blocks(a: Any, b: Any, shape: tuple, ordered: bool = True) -> bool:
  """True when ``a`` and ``b`` place the same block of a ``shape`` array on each
  device (and, if ``ordered``, list the devices in the same order, so per-device
  buffers can be handed over as they are)."""
  if ordered and list(a._device_assignment) != list(b._device_assignment):
    return False
  try:
    return _block_map(a, shape) == _block_map(b, shape)
  except Exception:  # pylint: disable=broad-except  # not expressible for this rank
    return False
