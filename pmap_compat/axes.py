"""Matching ``in_axes`` / ``out_axes`` to values: prefix broadcasting, negative axes, mapped size.

Negative axes are normalised against the rank the way ``vmap`` does it (legacy pmap
hits an internal assertion; JAX's shard_map-based pmaps silently use axis 0).
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable, Sequence

import numpy as np
from jax._src.tree_util import broadcast_prefix, prefix_errors
from jax.tree_util import tree_flatten

from pmap_compat import errors


def _is_none(x: Any) -> bool:
  return x is None


def hashable_axes(spec: Any) -> Any:
  """A hashable stand-in for an axes pytree (dicts and lists are not hashable)."""
  leaves, tree = tree_flatten(spec, is_leaf=_is_none)
  try:
    hash(tree)
  except TypeError:  # custom node with unhashable aux data: no sharing, but still correct
    return ("unhashable", id(spec))
  return tree, tuple(leaves)


def in_axes_per_leaf(in_axes: Any, args: tuple, kwargs: dict) -> tuple[int | None, ...]:
  """One axis (or None) per leaf of ``(args, kwargs)``; kwargs are always mapped on axis 0."""
  try:
    return tuple(broadcast_prefix((in_axes, 0), (args, kwargs), is_leaf=_is_none))
  except ValueError:
    mismatch = next(iter(prefix_errors((in_axes, 0), (args, kwargs))), None)
    detail = mismatch("pmap in_axes").args[0] if mismatch is not None else str(in_axes)
    raise errors.in_axes_not_prefix(bool(kwargs), detail) from None


def out_axes_per_leaf(out_axes: Any, out: Any) -> tuple[int | None, ...]:
  try:
    return tuple(broadcast_prefix(out_axes, out, is_leaf=_is_none))
  except ValueError:
    mismatch = next(iter(prefix_errors(out_axes, out)), None)
    detail = mismatch("pmap out_axes").args[0] if mismatch is not None else str(out_axes)
    raise errors.out_axes_not_prefix(detail) from None


def normalise_in_axis(axis: int | None, shape: tuple) -> int | None:
  """A non-negative axis into ``shape``; legacy's rank error when it does not exist."""
  if axis is None:
    return None
  rank = len(shape)
  if not -rank <= axis < rank:
    raise errors.rank_too_small(axis, shape)
  return axis % rank


def normalise_out_axis(axis: int | None, rank_inside: int) -> int | None:
  """Position of the re-inserted mapped axis in an output of per-device rank ``rank_inside``."""
  if axis is None:
    return None
  rank = rank_inside + 1
  if not -rank <= axis < rank:
    raise ValueError(f"pmap out_axes={axis} is out of bounds for an output of rank "
                     f"{rank_inside} (rank {rank} once the mapped axis is put back)")
  return axis % rank


def mapped_size(fun: Callable, args: tuple, kwargs: dict, leaves: Sequence[Any],
                axes: Sequence[int | None], axis_size: int | None) -> int:
  """The size of the mapped axis, with legacy's checks and messages.

  ``axes`` must already be normalised. With every axis None, ``axis_size`` gives
  the size (legacy rejects that case; we support it). A size of 0 has no device to run
  on: an error naming the empty argument.
  """
  if not leaves:
    raise errors.no_arguments(args, kwargs)
  sizes = {np.shape(x)[d] for x, d in zip(leaves, axes, strict=True) if d is not None}
  if not sizes:
    if axis_size is None:
      raise errors.nothing_mapped()
    if axis_size < 1:
      raise errors.axis_size_not_positive(axis_size)
    return axis_size
  if len(sizes) > 1:
    raise errors.inconsistent_sizes(fun, args, kwargs, axes)
  size, = sizes
  if axis_size is not None and axis_size != size:
    raise errors.axis_size_mismatch(axis_size, size)
  if size == 0:  # legacy aborts the process here
    raise errors.empty_mapped_axis(fun, args, kwargs, axes)
  return size
