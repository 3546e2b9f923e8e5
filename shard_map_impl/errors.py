"""Error reporting for shard_map: exception types and message builders.

Staging and eager execution detect bad outputs (spec too long for the value's
rank, replication that cannot be proven) and raise the internal exceptions
below with one entry per flat output (``None`` where that output is fine);
``api`` turns them into user-facing ``ValueError``s naming the offending
``out_specs`` entry.  Input-side problems are reported directly.
"""
from __future__ import annotations

import inspect
from typing import Any, NamedTuple
from collections.abc import Callable, Sequence

from jax._src.tree_util import broadcast_prefix, generate_key_paths, keystr
from jax.tree_util import PyTreeDef, tree_leaves, tree_structure, tree_unflatten

from shard_map_impl.jax_line import (CHECK_ARG, INPUTS_MUST_MATCH_EXPLICIT_SPECS, PASSED_ARGS_WORDING,
                                     SPEC_CHECK_READS_REDUCED,
                                     VMAPPED_AXES_LEAVE_MESH, WORDING_CORE,
                                     vmapped_mesh_axes, without_size_one_axes)
from shard_map_impl.specs import AnyMesh, Specs, canonicalize_spec, spec_axes, unmentioned_axes

P_HINT = "where `P = jax.sharding.PartitionSpec`"


class OutputRankError(Exception):
  """An out_specs entry is longer than the rank of its output."""
  def __init__(self, failures: Sequence[Any]):
    super().__init__(failures)
    self.failures = list(failures)


class Unproven(NamedTuple):
  """An output's failed replication check: the axes it is known equal along, and
  those it is a partial sum over (unreduced/reduced: neither equal nor varying)."""
  rep: frozenset
  partial: frozenset


class OutputReplicationError(Exception):
  """An output is not provably replicated over axes its out_specs omits
  (one ``Unproven`` per failing flat output)."""
  def __init__(self, failures: Sequence[Any]):
    super().__init__(failures)
    self.failures = list(failures)


def _fun_name(f: Callable) -> str:
  return getattr(f, "__name__", str(f))


class _Tag:
  """Leaf wrapper so (path, spec) pairs broadcast as single leaves."""
  __slots__ = ("path", "spec")

  def __init__(self, path: tuple, spec: Any):
    self.path, self.spec = path, spec


def failing_entries(tree: PyTreeDef, specs: Specs, failures: Sequence[Any]) -> list[tuple]:
  """[(spec_path, spec, value_path, failure)] for each failing flat value."""
  tagged = tree_unflatten(tree_structure(specs, is_leaf=lambda x: x is None),
                          [_Tag(p, s) for p, s in generate_key_paths(
                              specs, is_leaf=lambda x: x is None)])
  values = tree_unflatten(tree, list(range(tree.num_leaves)))
  per_leaf = broadcast_prefix(tagged, values, is_leaf=lambda x: isinstance(x, _Tag))
  value_paths = [p for p, _ in generate_key_paths(values)]
  out = []
  for tag, vpath, fail in zip(per_leaf, value_paths, failures, strict=True):
    if fail is not None and tag.spec is not None:
      out.append((tag.path, tag.spec, vpath, fail))
  return out


def _bullets(lines: list[str]) -> str:
  if len(lines) == 1:
    return lines[0]
  return "\n\n".join("* " + l for l in lines)


def _param_note(f: Callable, tree: PyTreeDef, value_path: tuple) -> str:
  """", where args[i] is bound to f's parameter 'name'," when inferable."""
  try:
    bound = inspect.signature(f).bind(*tree_unflatten(tree, [0] * tree.num_leaves))
  except (TypeError, ValueError):
    return ""
  idx = value_path[0].idx
  names = list(bound.arguments)
  name = _fun_name(f)
  if idx < len(names) and idx < len(bound.signature.parameters) and \
      list(bound.signature.parameters.values())[idx].kind != inspect.Parameter.VAR_POSITIONAL:
    return f", where args[{idx}] is bound to {name}'s parameter '{names[idx]}',"
  var = list(bound.signature.parameters.values())[-1]
  pos = idx - len(bound.signature.parameters) + 1
  return (f", where args[{idx}] is the index {pos} component of {name}'s "
          f"varargs parameter '{var.name}',")


def checked_arguments(f: object, mesh: AnyMesh, auto: frozenset) -> frozenset:
  """Validate shard_map's non-spec arguments; returns ``auto`` as a frozenset."""
  from jax._src.mesh import AbstractMesh, Mesh
  what: Exception | None = None
  if not callable(f):
    what = TypeError(f"shard_map requires a callable for its first argument, "
                     f"but got {f} of type {type(f)}.")
  elif not isinstance(mesh, (Mesh, AbstractMesh)):
    what = TypeError(f"shard_map requires a `jax.sharding.Mesh` or a "
                     f"`jax.sharding.AbstractMesh` instance for its second "
                     f"argument, but got {mesh} of type {type(mesh)}.")
  elif mesh.empty:  # before any spec is read against its (missing) axes
    what = ValueError(f"shard_map requires a non-empty mesh. Got {mesh}")
  else:
    auto = frozenset(auto)
    stray = auto - set(mesh.axis_names)
    if stray:
      what = ValueError(f"shard_map requires auto={auto} to be a subset of "
                        f"mesh.axis_names={mesh.axis_names} (not in the mesh: "
                        f"{sorted(stray, key=str)})")
  if what is not None:
    raise what
  return auto


def in_specs_none() -> TypeError:
  return TypeError(
      "shard_map in_specs argument must be a pytree of "
      "`jax.sharding.PartitionSpec` instances, but it was None.\n"
      f"Instead of `in_specs=None`, did you mean `in_specs=P()`, {P_HINT}?")


def auto_from_axis_names(f: object, mesh: AnyMesh, axis_names: Any) -> frozenset:
  """``auto`` (axes left to the compiler) for jax.shard_map's ``axis_names``."""
  checked_arguments(f, mesh, frozenset())
  if not isinstance(axis_names, (frozenset, set)):
    raise TypeError("`axis_names` argument of shard_map should be of type `frozenset` or"
                    f" `set`. Got type: {type(axis_names)}")
  # Axes an enclosing vmap spent (0.10's explicit vmap over mesh axes) are not offered.
  names = frozenset(mesh.axis_names) - vmapped_mesh_axes()
  manual = frozenset(axis_names) or names
  if not manual <= names:
    shown = names if VMAPPED_AXES_LEAVE_MESH else mesh.axis_names
    raise ValueError(f"jax.shard_map requires axis_names={frozenset(axis_names)} to be a "
                     f"subset of mesh.axis_names={shown}")
  already = frozenset(getattr(mesh, "manual_axes", ()))
  return frozenset(a for a in mesh.axis_names if a not in manual and a not in already)


def manual_names(mesh: AnyMesh, auto: frozenset, axis_names: Any = None) -> frozenset:
  """The manual axes as jax.shard_map holds them (the set messages print)."""
  if axis_names:
    return frozenset(axis_names)
  every = frozenset(mesh.axis_names) - vmapped_mesh_axes()
  return every - auto if auto else every


def check_inferable(mesh: AnyMesh, manual: frozenset) -> None:
  """in_specs may be omitted only where every manual axis is Explicit."""
  from jax._src.mesh import AxisType
  kinds = mesh._name_to_type
  if not all(kinds[a] == AxisType.Explicit for a in manual):
    # `manual` is the set as jax.shard_map holds it (manual_names): a set's printed order
    # depends on how it was built, so it is printed as it is, not rebuilt.
    types = ", ".join(str(kinds[a]) for a in manual)
    raise TypeError("shard_map in_specs argument must be a pytree of "
                    "`jax.sharding.PartitionSpec` instances, but it was `None` when "
                    f"axis_names={manual} are of type {types}")


def check_partial_sum_specs(kind: str, mesh: AnyMesh, manual: frozenset, specs: Any) -> None:
  """Unreduced/reduced spec axes: jax.shard_map's own errors, else ours.

  jax.shard_map takes them only when fully manual over Explicit axes.
  """
  from jax._src.mesh import AxisType
  kinds = "unreduced/reduced" if SPEC_CHECK_READS_REDUCED else "unreduced"
  for spec in tree_leaves(specs):
    unreduced: frozenset = getattr(spec, "unreduced", frozenset())
    reduced: frozenset = (getattr(spec, "reduced", frozenset()) if SPEC_CHECK_READS_REDUCED
                          else frozenset())
    if not unreduced and not reduced:
      continue
    if frozenset(mesh.axis_names) != manual:
      raise NotImplementedError(
          f"{kinds} can only be passed to {kind}_specs when shard_map is in "
          f"full manual mode. Got mesh axis names {mesh.axis_names}, manual_axes: "
          f"{manual}, specs: {spec}. Please file a bug at "
          "https://github.com/jax-ml/jax/issues.")
    for label, axes in (("unreduced", unreduced), ("reduced", reduced)):
      if not all(mesh._name_to_type[a] == AxisType.Explicit for a in axes):
        raise ValueError(
            f"{label} in {kind}_specs {spec} can only be used when the mesh passed to "
            f"shard_map contains axis names all of type `Explicit`. Got mesh {mesh}")


def fully_manual_explicit(mesh: AnyMesh, manual: frozenset) -> bool:
  """Whether the body takes every mesh axis an enclosing vmap does not, all Explicit."""
  from jax._src.mesh import AxisType
  every = frozenset(mesh.axis_names) - vmapped_mesh_axes()
  return manual == every and all(mesh._name_to_type[a] == AxisType.Explicit for a in manual)


def check_inputs_match_specs(mesh: AnyMesh, manual: frozenset, specs: Sequence[Any],
                             args: Sequence[Any]) -> None:
  """Fully manual over Explicit axes, jax.shard_map (0.10) reshards nothing: each
  argument must already be sharded as its in_spec says."""
  from jax._src import core
  if not INPUTS_MUST_MATCH_EXPLICIT_SPECS or not fully_manual_explicit(mesh, manual):
    return
  for spec, x in zip(specs, args, strict=True):
    aval = core.typeof(x)
    want = without_size_one_axes(spec._normalized_spec_for_aval(aval.ndim), mesh)
    if aval.sharding.spec != want:
      raise ValueError(
          f"in_specs passed to shard_map: {want} does not match the specs of the input: "
          f"{aval.sharding.spec} for arg: {aval}. `in_specs` is an optional argument so you "
          "can omit specifying it and shard_map will infer the in_specs from the arguments."
          " If you want to reshard your inputs, you can use `jax.reshard` on the arguments "
          "and then pass those args to shard_map.")


def bad_spec_leaves(kind: str, mesh: AnyMesh | None, bad_type: list, bad_auto: list,
                    auto: frozenset, manual: frozenset | None = None) -> Exception:
  """TypeError for non-PartitionSpec leaves, else ValueError for auto axes."""
  arg = f"{kind}_specs"
  if bad_type:
    lines = [f"  {arg}{keystr(p)} is {x} of type {type(x).__name__}, "
             for p, x in bad_type]
    return TypeError(
        f"shard_map {arg} argument must be a pytree of "
        "`jax.sharding.PartitionSpec` instances, but:\n\n" + "\n\n".join(lines)
        + f"\n\nCheck the {arg} values passed to shard_map.")
  lines = [f"  {arg}{keystr(p)} refers to {a!r}" for p, a in bad_auto]
  assert mesh is not None, "axis problems are found against a mesh"
  shown = manual_names(mesh, auto) if manual is None else manual
  what = (f"must refer to an axis marked as manual ({shown})"
          if WORDING_CORE else f"cannot refer to an axis marked auto ({auto})")
  return ValueError(
      f"shard_map {arg} argument {what}, "
      "but:\n\n" + "\n\n".join(lines)
      + f"\n\nCheck the {arg} values passed to shard_map.")


def rank_error(kind: str, f: Callable, tree: PyTreeDef, specs: Specs,
               failures: Sequence[Any]) -> ValueError:
  """Spec longer than the rank of the value it describes (in or out)."""
  name = _fun_name(f)
  arg = f"{kind}_specs"
  base = _passed_args() if kind == "in" else f"{name}(*args)"
  entries = failing_entries(tree, specs, failures)
  lines = []
  for spath, spec, vpath, aval in entries:
    note = _param_note(f, tree, vpath) if kind == "in" else ""
    lines.append(
        f"{arg}{keystr(spath)} is {spec} which has length {len(spec)}, but "
        f"{base}{keystr(vpath)}{note} has shape {aval.str_short()}, which has "
        f"rank {aval.ndim} (and {aval.ndim} < {len(spec)})")
  io = "input" if kind == "in" else "output"
  msg = (f"shard_map applied to the function '{name}' was given an {arg} entry "
         f"which is too long to be compatible with the corresponding {io} "
         f"value from the function:\n\n{_bullets(lines)}\n\n"
         f"Entries in {arg} must be of length no greater than the number of "
         f"axes in the corresponding {io} value.\n\nEither revise the spec to "
         f"be shorter, or modify '{name}' so that its {io}s have sufficient rank.")
  if any(aval.ndim == 0 for *_, aval in entries):
    msg += (f"\n\nFor scalar values (rank 0), consider using an {arg} entry of "
            f"`P()`, {P_HINT}.")
  if kind == "out" and any(aval.ndim == 0 for *_, aval in entries):
    msg += (" In particular, for rank 0 outputs which are not constant over "
            "the mesh, add at least one (singleton) axis to them so that they "
            "can be concatenated using out_specs.")
  return ValueError(msg)


def _passed_args() -> str:
  return "the passed args" if PASSED_ARGS_WORDING else "args"


def _mesh_line(mesh: AnyMesh) -> str:
  return (f"The mesh given has shape {tuple(mesh.shape.values())} with "
          f"corresponding axis names {mesh.axis_names}.")


def divisibility_error(f: Callable, mesh: AnyMesh, tree: PyTreeDef, specs: Specs,
                       failures: Sequence[Any]) -> ValueError:
  name = _fun_name(f)
  lines = []
  for spath, spec, vpath, aval in failing_entries(tree, specs, failures):
    note = _param_note(f, tree, vpath)
    for dim, axes in canonicalize_spec(spec).items():
      size = 1
      for a in axes:
        size *= mesh.shape[a]
      if aval.shape[dim] % size == 0:
        continue
      what = f"axes {axes}" if len(axes) > 1 else f"axis '{axes[0]}'"
      total = "total " if len(axes) > 1 else ""
      lines.append(
          f"{_passed_args()}{keystr(vpath)} of shape {aval.str_short()}{note} corresponds "
          f"to in_specs{keystr(spath)} of value {spec}, which maps array axis "
          f"{dim} (of size {aval.shape[dim]}) to mesh {what} (of {total}size "
          f"{size}), but {size} does not evenly divide {aval.shape[dim]}")
  return ValueError(
      f"shard_map applied to the function '{name}' was given argument arrays "
      "with axis sizes that are not evenly divisible by the corresponding mesh "
      f"axis sizes:\n\n{_mesh_line(mesh)}\n\n{_bullets(lines)}\n\n"
      "Array arguments' axis sizes must be evenly divisible by the mesh axis or "
      "axes indicated by the corresponding elements of the argument's in_specs "
      "entry. Consider checking that in_specs are correct, and if so consider "
      f"changing the mesh axis sizes or else padding the input and adapting "
      f"'{name}' appropriately.")


def replication_error(f: Callable, mesh: AnyMesh, auto: frozenset, tree: PyTreeDef, specs: Specs,
                      failures: Sequence[Any]) -> ValueError:
  """Outputs whose inferred replication misses axes out_specs leave out."""
  name = _fun_name(f)
  lines = []
  for spath, spec, _, (rep, partial) in failing_entries(tree, specs, failures):
    names = canonicalize_spec(spec)
    unmentioned = unmentioned_axes(mesh, names)
    need = [a for a in unmentioned if a not in auto]
    got = [a for a in mesh.axis_names if a in rep]
    missing = [a for a in need if a not in rep]
    if WORDING_CORE:  # the core shard_map picks its wording counting auto axes too
      need = unmentioned
    if len(need) > 1 and WORDING_CORE:  # its wording: in varying axes
      varying = [a for a in mesh.axis_names if a not in rep | auto | partial]
      split = [a for a in mesh.axis_names if a in spec_axes(names) and a not in auto]
      lines.append(
          f"out_specs{keystr(spath)} is {spec} which implies that the "
          f"corresponding output value is only varying across mesh axes "
          f"{{{','.join(map(str, split))}}} "
          f"and not {{{','.join(map(str, [a for a in need if a in varying]))}}}, but it was "
          f"inferred to be possibly varying over {{{','.join(map(str, varying))}}}")
    elif len(need) > 1:
      lines.append(
          f"out_specs{keystr(spath)} is {spec} which implies that the "
          f"corresponding output value is replicated across mesh axes "
          f"{{{','.join(map(str, need))}}}, but could only infer replication "
          f"over {{{','.join(map(str, got))}}}, which is missing the required "
          f"axes {','.join(map(str, missing))}")
    else:
      lines.append(
          f"out_specs{keystr(spath)} is {spec} which implies that the "
          f"corresponding output value is replicated across mesh axis "
          f"'{need[0]}', but could not infer replication over any axes")
  return ValueError(
      f"shard_map applied to the function '{name}' was given out_specs which "
      "require replication which can't be statically inferred given the mesh:"
      f"\n\n{_mesh_line(mesh)}\n\n{_bullets(lines)}\n\n"
      "Check if these output values are meant to be replicated over those mesh "
      "axes. If not, consider revising the corresponding out_specs entries. If "
      f"so, consider disabling the check by passing the {CHECK_ARG}=False "
      f"argument to {'`jax.shard_map`' if WORDING_CORE else 'shard_map'}.")

