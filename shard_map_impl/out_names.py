"""Hashable ``out_names_thunk`` objects for binding ``shard_map_p``.

Bind params are used as cache keys (e.g. by ``lu.cache``), so the thunks that
give a shard_map's output names once its body is traced compare by what they
compute, not by identity: a fixed value (re-binding from equation params) or a
derivation from other thunks (transformation rules).
"""
from __future__ import annotations

from typing import Any

from shard_map_impl.specs import AxisNames, OutNamesThunk, partial_sums


class ConstThunk:
  """A hashable zero-argument callable returning a fixed value.

  Used as ``out_names_thunk`` when re-binding from equation params, so that
  caches keyed on bind params (e.g. ``lu.cache``) see equal keys.
  """
  __slots__ = ("value",)

  def __init__(self, value: Any):
    self.value = value

  def __call__(self) -> Any:
    return self.value

  def _key(self):
    return tuple((tuple(sorted(d.items())), partial_sums(d)) for d in self.value)

  def __hash__(self) -> int:
    return hash(self._key())

  def __eq__(self, other: object) -> bool:
    return isinstance(other, ConstThunk) and self._key() == other._key()


class DerivedNames:
  """Hashable, memoising ``out_names_thunk`` computed from other thunks.

  ``key`` identifies what the result depends on (the thunks and static data
  it closes over), so two rules building the same derivation compare equal.
  """
  __slots__ = ("_compute", "_key", "_value")

  def __init__(self, compute: OutNamesThunk, key: Any):
    self._compute = compute
    self._key = key
    self._value: tuple[AxisNames, ...] | None = None

  def __call__(self) -> tuple[AxisNames, ...]:
    if self._value is None:
      self._value = tuple(self._compute())
    return self._value

  def __hash__(self) -> int:
    return hash(self._key)

  def __eq__(self, other: object) -> bool:
    return isinstance(other, DerivedNames) and self._key == other._key
