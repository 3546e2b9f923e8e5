"""``same_message``: a program fails under legacy jax.pmap and pmap_compat with one message."""
from __future__ import annotations

from typing import Any
from collections.abc import Callable

from pmap_compat import pmap
from support.compare import compare_with_legacy


def same_message(program: Callable[[Callable], Any]) -> None:
  """Both raise the same exception type and the same message."""
  legacy = compare_with_legacy(program, pmap)
  assert legacy.error is not None, "the program was meant to fail under legacy pmap"
  try:
    program(pmap)
  except Exception as ours:  # pylint: disable=broad-except
    assert str(ours) == str(legacy.error), f"\nlegacy: {legacy.error}\nours:   {ours}"
    return
  raise AssertionError("pmap_compat did not raise")
