"""``smap``: jax 0.10's single-axis shard_map, built on our ``shard_map``.

``smap(f, in_axes=..., out_axes=..., axis_name=a)`` is ``shard_map`` over the
context mesh, manual over the one axis ``a`` only, with vmap-style axes in
place of specs: array axis ``i`` split over ``a`` is the spec ``P(None, ...,
None, a)`` (``i`` Nones), ``None`` an argument or result left whole.  Omitted
``in_axes`` are inferred from Explicit-axis argument shardings.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import Any

from jax._src import traceback_util
from jax._src.mesh import AxisType, get_abstract_mesh
from jax.sharding import PartitionSpec
from jax.tree_util import tree_leaves, tree_map

from shard_map_impl.api import Infer, infers, shard_map

traceback_util.register_exclusion(__file__)


def smap(f: Callable | None = None, /, *, in_axes: Any = Infer, out_axes: Any,
         axis_name: Hashable) -> Any:
  """Map ``f`` over shards along mesh axis ``axis_name`` of the context mesh.

  Args:
    f: the per-shard function (omitted: returns a decorator).
    in_axes: an int, None, or a tuple with one entry (int, None or a nested
      container of them) per positional argument: the array axis split over
      ``axis_name``; None leaves an argument whole.  Default: inferred from the
      arguments' shardings, which needs ``axis_name`` to be Explicit.
    out_axes: an int, None or a nested container of them: where each result's
      split axis goes.
    axis_name: the one mesh axis ``f`` is manual over.
  """
  _check_arguments(in_axes, out_axes, axis_name)
  if f is None:
    return lambda g: _smap(g, in_axes, out_axes, axis_name)
  return _smap(f, in_axes, out_axes, axis_name)


def _check_arguments(in_axes: Any, out_axes: Any, axis_name: Any) -> None:
  problem = _argument_problem(in_axes, out_axes, axis_name)
  if problem is not None:
    raise TypeError(problem)


def _argument_problem(in_axes: Any, out_axes: Any, axis_name: Any) -> str | None:
  """What is wrong with smap's arguments, in jax.smap's words (None: nothing)."""
  def ints_only(tree: Any) -> bool:
    return all(isinstance(a, int) for a in tree_leaves(tree))

  kinds = "an int, None, jax.sharding.Infer, or"
  if isinstance(axis_name, (list, tuple)):
    return f"smap axis_name should be a `str` or a `Hashable`, but got {axis_name}"
  if not infers(in_axes):
    if in_axes is not None and not isinstance(in_axes, (int, tuple)):
      return (f"smap in_axes must be {kinds} a tuple of entries corresponding to the "
              f"positional arguments passed to the function, but got {in_axes}.")
    if not ints_only(in_axes):
      return (f"smap in_axes must be {kinds} (nested) container with those types as "
              f"leaves, but got {in_axes}.")
  if not ints_only(out_axes):
    return ("smap out_axes must be an int, None, or (nested) container with those types "
            f"as leaves, but got {out_axes}.")
  return None


def _axis_spec(axis_name: Hashable, axis: int | None) -> PartitionSpec:
  """Array axis ``axis`` split over ``axis_name`` as a spec (None: not split)."""
  if axis is None:
    return PartitionSpec()
  return PartitionSpec(*[None] * axis, axis_name)


def _specs(axes: Any, axis_name: Hashable) -> Any:
  return tree_map(lambda a: _axis_spec(axis_name, a), axes, is_leaf=lambda x: x is None)


def _smap(f: Callable, in_axes: Any, out_axes: Any, axis_name: Hashable) -> Callable:
  in_specs = in_axes if infers(in_axes) else _specs(in_axes, axis_name)
  mapped = shard_map(f, in_specs=in_specs, out_specs=_specs(out_axes, axis_name),
                     axis_names={axis_name}, check_vma=True)
  if not infers(in_axes):
    return mapped

  @functools.wraps(f)
  @traceback_util.api_boundary
  def inferring(*args: Any) -> Any:
    _check_inferable(axis_name)
    return mapped(*args)
  return inferring


def _check_inferable(axis_name: Hashable) -> None:
  """Omitted in_axes need ``axis_name`` Explicit in the context mesh (smap's wording;
  an empty mesh or an axis outside it is left to shard_map's own errors)."""
  mesh = get_abstract_mesh()
  if mesh.empty or axis_name not in mesh.axis_names:
    return
  kind = mesh._name_to_type[axis_name]
  if kind != AxisType.Explicit:
    raise TypeError(f"in_axes was not specified when axis_name={frozenset({axis_name})} "
                    f"was of type {kind}")
