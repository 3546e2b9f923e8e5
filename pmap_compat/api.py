"""``pmap``: the public entry point, with legacy ``jax.pmap``'s signature and argument checks."""
from __future__ import annotations

import operator
from typing import Any
from collections.abc import Callable, Iterable, Sequence

from jax._src.api_util import _ensure_index_tuple, rebase_donate_argnums

from pmap_compat import errors
from pmap_compat.config import PmapConfig
from pmap_compat.wrapper import make_wrapper


def pmap(fun: Callable, axis_name: Any = None, *, in_axes: Any = 0, out_axes: Any = 0,
         static_broadcasted_argnums: int | Iterable[int] = (),
         devices: Sequence[Any] | None = None, backend: str | None = None,
         axis_size: int | None = None, donate_argnums: int | Iterable[int] = (),
         global_arg_shapes: Any = None, check_replicated: bool = False) -> Callable:
  """Drop-in for legacy ``jax.pmap`` built on ``shard_map_impl.shard_map`` and ``jax.jit``.

  Same arguments and results as ``jax.pmap``. Extra, keyword-only: ``check_replicated``
  makes a call raise ValueError when an ``out_axes=None`` output differs between
  devices (legacy silently returns device 0's value).
  """
  if global_arg_shapes is not None:
    raise errors.global_arg_shapes_removed()
  if not callable(fun):
    raise TypeError(f"Expected a callable value, got {fun}")
  errors.check_axes_spec(in_axes, "in_axes")
  errors.check_axes_spec(out_axes, "out_axes")
  hash(fun)  # legacy's TypeError ("unhashable type: ...") for a callable with __hash__ = None
  given = _ensure_index_tuple(static_broadcasted_argnums)
  donate = _ensure_index_tuple(donate_argnums)
  rebase_donate_argnums(donate, given)  # legacy's error when the two intersect
  cfg = PmapConfig(
      axis_name=axis_name, in_axes=in_axes, out_axes=out_axes, static=_static_positions(given),
      static_given=given, donate=tuple(sorted(set(donate))),
      devices=errors.check_devices(devices), backend=backend, axis_size=_index(axis_size),
      strict_replication=bool(check_replicated))
  return make_wrapper(fun, cfg)


def _static_positions(given: tuple[int, ...]) -> tuple[int, ...]:
  """The positions legacy treats as static: each once (jit would pass a repeated one
  twice), negative ones left out (legacy's split ignores them too)."""
  return tuple(sorted({i for i in given if i >= 0}))


def _index(axis_size: Any) -> int | None:
  """Any integral value, as legacy (np.int64(8), True). Its sign is checked per call,
  against the mapped size, where legacy checks it."""
  if axis_size is None:
    return None
  try:
    return operator.index(axis_size)
  except TypeError:
    raise TypeError(f"pmap axis_size must be an integer or None, got {axis_size!r} of type "
                    f"{type(axis_size).__name__}") from None
