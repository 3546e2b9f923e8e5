"""Slow-path input placement for the plain-jit path (calls under a trace, ``.lower``).

Concrete arrays go through ``pmap_compat.inputs.place`` (issue 6: on-device resharding,
never via the host); tracers get a ``jax.device_put`` (a sharding constraint in a trace).
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
from jax._src import core
from jax.sharding import Sharding

from pmap_compat import inputs


def _place(x: Any, s: Sharding) -> Any:
  if isinstance(x, core.Tracer):
    return jax.device_put(x, s)
  return inputs.place(x, s)


def place_leaves(leaves: Sequence[Any], shardings: Sequence[Sharding]) -> list | None:
  """Each leaf on its sharding; None when every leaf was already where it belongs."""
  moved = [_place(x, s) for x, s in zip(leaves, shardings)]
  return None if all(m is x for m, x in zip(moved, leaves)) else moved
