"""The normalised, hashable parameters of one ``pmap(...)`` application."""
from __future__ import annotations

from typing import Any, NamedTuple

from pmap_compat import axes


class PmapConfig(NamedTuple):
  axis_name: Any            # None: a deterministic default name (see nesting.default_axis_name)
  in_axes: Any              # as given (a pytree prefix of the positional args)
  out_axes: Any             # as given (a pytree prefix of the output)
  static: tuple[int, ...]   # static positions: static_broadcasted_argnums >= 0, sorted, unique
  static_given: tuple[int, ...]  # static_broadcasted_argnums as given (legacy's messages)
  donate: tuple[int, ...]   # donate_argnums (positions among all positional args)
  devices: tuple | None
  backend: str | None
  axis_size: int | None
  strict_replication: bool  # check out_axes=None outputs really are replicated

  def key(self) -> tuple:
    """Cache key: ``in_axes``/``out_axes`` may hold dicts or lists, so freeze them."""
    return (self.axis_name, axes.hashable_axes(self.in_axes), axes.hashable_axes(self.out_axes),
            self.static, self.static_given, self.donate,
            None if self.devices is None else tuple(d.id for d in self.devices),
            self.backend, self.axis_size, self.strict_replication)
