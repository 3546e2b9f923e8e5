"""``pmap``: the public entry point, with legacy ``jax.pmap``'s signature and argument checks."""
from __future__ import annotations

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
  if axis_size is not None and (type(axis_size) is not int or axis_size < 1):
    raise TypeError(f"pmap axis_size must be a positive int or None, got {axis_size!r}")
  static = _ensure_index_tuple(static_broadcasted_argnums)
  donate = _ensure_index_tuple(donate_argnums)
  rebase_donate_argnums(donate, static)  # legacy's error when the two intersect
  cfg = PmapConfig(
      axis_name=axis_name, in_axes=in_axes, out_axes=out_axes, static=static, donate=donate,
      devices=errors.check_devices(devices), backend=backend, axis_size=axis_size,
      strict_replication=bool(check_replicated))
  return make_wrapper(fun, cfg)
