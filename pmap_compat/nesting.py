"""Nested pmap: ``pmap(pmap(f, 'j'), 'i')`` as ONE shard_map over a multi-axis mesh.

While the outermost pmap traces its body, a thread-local ``Frame`` records the mesh
axes that body is manual over. An inner pmap called there does not start a shard_map
of its own: it picks its slice of the mapped axis with ``axis_index`` and puts the
axis back on its outputs with ``all_gather`` (what legacy's nested lowering does with
replica ids). If the outer mesh lacks the inner axis, the inner pmap raises
``NeedAxis`` and the outermost pmap retraces over a mesh with that axis appended.
"""
from __future__ import annotations

import threading
from typing import Any
from collections.abc import Callable

import jax
import numpy as np
from jax import dtypes, lax
from jax.tree_util import tree_flatten, tree_unflatten

from pmap_compat import jax_line


class NeedAxis(Exception):
  """Raised by an inner pmap whose axis is missing from the outer mesh (caught by the outer)."""

  def __init__(self, name: Any, size: int):
    super().__init__(f"pmap_compat internal: nested pmap needs mesh axis {name!r} of size {size}")
    self.name = name
    self.size = size


class Frame:
  """The mesh axes (name -> size) the outermost pmap's body is manual over, and nesting depth."""

  __slots__ = ("sizes", "depth", "active")

  def __init__(self, sizes: dict[Any, int], outer: tuple):
    self.sizes = sizes
    self.depth = 1
    self.active = list(outer)  # axis names of the pmaps enclosing the code being traced


class _State(threading.local):
  frame: Frame | None = None


_STATE = _State()


class outer_body:
  """Context: the outermost pmap's body is being traced over the given mesh axes."""

  def __init__(self, sizes: dict[Any, int], outer: tuple):
    self.frame = Frame(sizes, outer)

  def __enter__(self) -> Frame:
    self.prev, _STATE.frame = _STATE.frame, self.frame
    return self.frame

  def __exit__(self, *exc) -> None:
    _STATE.frame = self.prev


def default_axis_name(depth: int, size: int) -> str:
  """Deterministic (HLO-stable) name for an unnamed pmap at a nesting depth."""
  return f"_pmap_compat_axis{depth}_{size}" if depth else jax_line.DEFAULT_AXIS_NAME


def require_axis(frame: Frame, name: Any, size: int) -> None:
  if name in frame.active:
    raise ValueError(
        f"nested pmap reuses the axis name {name!r} of an enclosing pmap; pmap_compat maps "
        "nested pmaps onto one mesh and cannot shadow an axis name: rename the inner axis")
  have = frame.sizes.get(name)
  if have is None:
    raise NeedAxis(name, size)
  if have != size:
    raise ValueError(
        f"nested pmap over axis {name!r} has size {size}, but an enclosing or earlier nested "
        f"pmap already uses {name!r} with size {have}; give the nested pmaps distinct "
        "axis_name values")


def run_nested(name: Any, leaves: list, in_axes: tuple, invoke: Callable[[list], Any],
               out_axes_for: Callable[[Any], tuple]) -> Any:
  """The inner pmap's semantics inside the outer body (see module docstring)."""
  frame = _STATE.frame
  assert frame is not None, "run_nested is only called while an outer pmap body is traced"
  idx = lax.axis_index(name)
  picked = [x if d is None else lax.dynamic_index_in_dim(x, idx, d, keepdims=False)
            for x, d in zip(leaves, in_axes, strict=True)]
  frame.depth += 1
  frame.active.append(name)
  try:
    out = invoke(picked)
  finally:
    frame.depth -= 1
    frame.active.pop()
  out_leaves, out_tree = tree_flatten(out)
  gathered = [y if d is None else _gather(y, name, d)
              for y, d in zip(out_leaves, out_axes_for(out), strict=True)]
  return tree_unflatten(out_tree, gathered)


def _gather(y: Any, name: Any, axis: int) -> Any:
  """all_gather, with -0.0 turned into +0.0 as legacy's all-reduce based unshard does."""
  out = lax.all_gather(y, name, axis=axis, tiled=False)
  return _positive_zero(out) if dtypes.issubdtype(out.dtype, np.inexact) else out


@jax.custom_jvp
def _positive_zero(x: Any) -> Any:
  zero = np.zeros((), x.dtype)
  return lax.select(x == zero, lax.full_like(x, zero), x)


@_positive_zero.defjvp
def _positive_zero_jvp(primals, tangents):
  # An identity as far as derivatives go: only the sign of zero changes.
  return _positive_zero(primals[0]), tangents[0]
