"""``same_message``: a program fails under legacy jax.pmap and pmap_compat with one message."""
from __future__ import annotations

import re
from typing import Any
from collections.abc import Callable

import jax

from pmap_compat import pmap
from support.compare import compare_with_legacy
from support.jax_lines import on_legacy_line

# How jax 0.6 printed this machine's devices (legacy's recorded messages name them so).
_LEGACY_DEVICE_NAMES = {f"cpu:{d.id}": f"TFRT_CPU_{d.id}" for d in jax.devices("cpu")}


def _as_legacy_prints_devices(message: str) -> str:
  """``message`` with devices named as jax 0.6 printed them (``str(device)`` changed:
  ``TFRT_CPU_0`` there, ``cpu:0`` on jax 0.10); unchanged on jax 0.6."""
  if on_legacy_line():
    return message
  for new, old in sorted(_LEGACY_DEVICE_NAMES.items(), key=lambda kv: -len(kv[0])):
    message = message.replace(new, old)
  return message


def _without_addresses(message: str) -> str:
  """Object addresses (a repr of the argument in the message) differ between runs."""
  return re.sub(r"0x[0-9a-fA-F]+", "0x…", message)


def same_message(program: Callable[[Callable], Any]) -> None:
  """Both raise the same exception type and the same message (up to object addresses)."""
  legacy = compare_with_legacy(program, pmap)
  assert legacy.error is not None, "the program was meant to fail under legacy pmap"
  try:
    program(pmap)
  except Exception as ours:  # pylint: disable=broad-except
    text = _without_addresses(_as_legacy_prints_devices(str(ours)))
    expected = _without_addresses(str(legacy.error))
    assert text == expected, f"\nlegacy: {expected}\nours:   {text}"
    return
  raise AssertionError("pmap_compat did not raise")
