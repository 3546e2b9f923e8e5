"""Partition specs: canonical per-input axis names, and validation of specs.

A ``PartitionSpec`` is canonicalised to ``AxisNames``: a dict from array
dimension to the tuple of mesh axis names that dimension is split over
(dimensions not split are absent).  On 0.10 a spec may also name unreduced
and reduced axes (a partial sum, or a value whose cotangent is one); those
travel with the names (``partial_sums`` / ``with_partial_sums``) from the
user's spec through every rule to the staged equation, swapping places in a
cotangent's spec (``cotangent_names``).  Validation here covers the specs alone
(type, ``auto`` axes) and specs against argument shapes (rank, divisibility);
the messages themselves are built in ``errors``.
"""
from __future__ import annotations

from math import prod
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from jax._src import core
from jax._src.mesh import AbstractMesh, Mesh

from shard_map_impl.jax_line import (NO_SUMS, SPECS_NAME_MESH_AXES_ONLY, spec_entries,
                                     spec_partial_sums, with_spec_partial_sums)
from jax.sharding import PartitionSpec
from jax.tree_util import tree_leaves

AxisName = Hashable
AnyMesh = Mesh | AbstractMesh
# Array dimension -> the mesh axes it is split over (unsplit dimensions absent).
AxisNames = dict[int, tuple[AxisName, ...]]
# Gives a shard_map's output names once its body has been traced.
OutNamesThunk = Callable[[], Sequence[AxisNames]]
# A pytree of PartitionSpecs (None leaves allowed in in_specs).
Specs = PartitionSpec | None | Sequence["Specs"] | Mapping[Hashable, "Specs"]


class _SpecNames(dict):
  """``AxisNames`` that remember the ``PartitionSpec`` they were read from.

  A dict like any other (equality, printing); ``names_to_pspec`` gives the
  spec back as the user wrote it (``P('x', None)`` stays so), which is how
  JAX's own equations print their specs, unreduced/reduced axes included.
  """
  __slots__ = ("spec",)
  spec: PartitionSpec


def canonicalize_spec(spec: PartitionSpec | AxisNames) -> AxisNames:
  """``P('x', None, ('y', 'z'))`` -> ``{0: ('x',), 2: ('y', 'z')}``."""
  if not isinstance(spec, PartitionSpec):
    return spec  # already canonical
  names = _SpecNames()
  for dim, entry in enumerate(spec_entries(spec)):
    if entry is None:
      continue
    names[dim] = axis_tuple(entry)
  names.spec = spec
  return names


def names_to_pspec(names: AxisNames) -> PartitionSpec:
  """Inverse of ``canonicalize_spec`` (single names unpacked, as JAX does)."""
  if isinstance(names, _SpecNames):
    return names.spec
  if not names:
    return PartitionSpec()
  entries: list[AxisName | tuple[AxisName, ...] | None] = []
  for dim in range(max(names) + 1):
    axes = names.get(dim)
    entries.append(axes[0] if axes is not None and len(axes) == 1 else axes)
  return PartitionSpec(*entries)


def spec_axes(names: AxisNames) -> frozenset:
  """Every mesh axis an input/output is split over."""
  return frozenset(a for axes in names.values() for a in axes)


def partial_sums(names: AxisNames) -> tuple[frozenset, frozenset]:
  """The (unreduced, reduced) axes of the spec ``names`` was read from (0.10)."""
  if isinstance(names, _SpecNames):
    return spec_partial_sums(names.spec)
  return NO_SUMS


def with_partial_sums(names: AxisNames, sums: tuple[frozenset, frozenset]) -> AxisNames:
  """``names`` describing a spec whose (unreduced, reduced) axes are ``sums``."""
  if partial_sums(names) == sums:
    return names
  return canonicalize_spec(with_spec_partial_sums(names_to_pspec(names), *sums))


def cotangent_names(names: AxisNames) -> AxisNames:
  """The spec of a cotangent: unreduced and reduced axes swap places."""
  unreduced, reduced = partial_sums(names)
  return with_partial_sums(names, (reduced, unreduced))


def unmentioned_axes(mesh: AnyMesh, names: AxisNames) -> list:
  """Mesh axes (in mesh order) a spec does not mention, i.e. replicated ones
  (a partial sum's axes are mentioned: unreduced/reduced promise no replication)."""
  unreduced, reduced = partial_sums(names)
  used = spec_axes(names) | unreduced | reduced
  return [a for a in mesh.axis_names if a not in used]


def axis_tuple(names: AxisName | tuple[AxisName, ...] | None) -> tuple[AxisName, ...]:
  """One axis name, a tuple of them, or None (no axes) -> a tuple of names."""
  if names is None:
    return ()
  return tuple(names) if isinstance(names, tuple) else (names,)


def _unusable(mesh: AnyMesh, auto: frozenset) -> Callable[[AxisName], bool]:
  """Axes a spec may not name: auto ones (and, on 0.10, ones not in the mesh)."""
  known = frozenset(mesh.axis_names)
  return lambda a: a in auto or (SPECS_NAME_MESH_AXES_ONLY and a not in known)


def spec_leaf_problems(mesh: AnyMesh, specs: Specs, auto: frozenset) -> tuple[list, list]:
  """(non-PartitionSpec leaves, (leaf, unusable axis) uses) among ``specs``."""
  from jax._src.tree_util import generate_key_paths
  bad_type: list[tuple[Any, Any]] = []
  bad_auto: list[tuple[Any, Any]] = []
  unusable = _unusable(mesh, auto)
  for path, leaf in generate_key_paths(specs):
    if not isinstance(leaf, PartitionSpec):
      bad_type.append((path, leaf))
      continue
    for entry in spec_entries(leaf):
      bad_auto.extend((path, a) for a in axis_tuple(entry) if unusable(a))
  return bad_type, bad_auto


def specs_are_valid(mesh: AnyMesh, specs: Specs, auto: frozenset) -> bool:
  unusable = _unusable(mesh, auto)
  for leaf in tree_leaves(specs):
    if not isinstance(leaf, PartitionSpec):
      return False
    if any(unusable(a) for e in spec_entries(leaf) for a in axis_tuple(e)):
      return False
  return True


def inferred_spec(mesh: AnyMesh, auto: frozenset, x: Any) -> PartitionSpec:
  """An argument's in_spec read off its (Explicit) sharding: its manual axes."""
  del mesh
  spec = core.typeof(x).sharding.spec
  entries: list[Any] = []
  for entry in spec_entries(spec):
    if entry is None:
      entries.append(None)
      continue
    names: list[Any] = [a if a not in auto else None for a in axis_tuple(entry)]
    while names and names[-1] is None:
      names.pop()
    if None in names:  # an auto axis before a manual one: no per-device block
      raise ValueError(f"Invalid spec: {spec}")
    if isinstance(entry, tuple):
      entries.append(tuple(names) or None)
    else:
      entries.append(names[0] if names else None)
  return with_spec_partial_sums(PartitionSpec(*entries), *spec_partial_sums(spec))


def rank_failures(specs_flat: Sequence[PartitionSpec], avals: Sequence) -> list:
  """Per input: the aval if its spec is longer than its rank, else None."""
  return [a if len(p) > a.ndim else None for p, a in zip(specs_flat, avals, strict=True)]


def divisibility_failures(mesh: AnyMesh, names_flat: Sequence[AxisNames],
                          avals: Sequence) -> list:
  """Per input: the aval if a mapped dim is not divisible, else None."""
  def bad(names: AxisNames, aval: core.ShapedArray) -> bool:
    return any(aval.shape[d] % prod(mesh.shape[n] for n in axes)
               for d, axes in names.items())
  return [a if bad(n, a) else None for n, a in zip(names_flat, avals, strict=True)]
