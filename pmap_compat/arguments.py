"""A call's positional arguments split into static and dynamic ones, and put back together."""
from __future__ import annotations

from typing import Any
from collections.abc import Iterable, Sequence


def split_static(args: Sequence[Any], static_argnums: Iterable[int]) -> tuple[list, dict[int, Any]]:
  """(dynamic arguments in order, position -> value of each static argument present).

  Negative positions are not static here: legacy pmap does not normalise them either.
  """
  static = {i: args[i] for i in static_argnums if 0 <= i < len(args)}
  return [a for i, a in enumerate(args) if i not in static], static


def merge_static(dynamic: Sequence[Any], static: dict[int, Any]) -> tuple:
  """The positional arguments again, static values at their positions."""
  rest = iter(dynamic)
  return tuple(static[i] if i in static else next(rest)
               for i in range(len(dynamic) + len(static)))
