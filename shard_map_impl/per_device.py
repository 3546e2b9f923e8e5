"""Per-device view of a shard_map body: manual meshes, axis env, avals.

Inside a body the manual mesh axes are bound in the axis environment (so
collectives can name them) and the abstract mesh marks them ``Manual``.  Values
crossing the boundary change aval: ``shard_aval`` divides each mapped
dimension by the product of its mesh axis sizes (global -> per device) and
``unshard_aval`` multiplies it back.  With ``jax_varying_axes_in_types`` on
(and replication checking on), per-device avals carry ``vma``: the set of
manual axes along which the value may vary.
"""
from __future__ import annotations

import contextlib
from math import prod
from collections.abc import Iterator

from jax._src import core
from jax._src import util
from jax._src.mesh import AbstractMesh, AxisType, get_abstract_mesh, use_abstract_mesh
from jax.sharding import NamedSharding, PartitionSpec

from shard_map_impl.jax_line import (BODY_TYPES_PARTIAL_SUMS, SHARD_KEEPS_OUTER_VMA,
                                     call_shard_handler,
                                     call_unshard_handler, check_flag, partial_sums_of, spec_entries,
                                     spec_partial_sums, varying_axes_typed, vma_of,
                                     with_manual_type, with_spec_partial_sums)
from shard_map_impl.specs import (NO_SUMS, AnyMesh, AxisNames, axis_tuple, names_to_pspec,
                                  partial_sums, spec_axes)

def vma_enabled(check_rep: bool) -> bool:
  """Whether per-device avals carry varying-axes types for this shard_map."""
  return bool(check_rep) and varying_axes_typed()


def manual_axes_of(mesh: AnyMesh, auto: frozenset) -> tuple:
  """Mesh axes a shard_map maps over (all but ``auto``), in mesh order."""
  return tuple(n for n in mesh.axis_names if n not in auto)


def manual_mesh(mesh: AnyMesh, auto: frozenset) -> AbstractMesh:
  """The abstract mesh seen inside the body: manual axes typed ``Manual``.

  ``auto`` axes keep the type they have in the surrounding abstract mesh
  (falling back to ``mesh`` itself), so Explicit axes stay Explicit.
  """
  context = get_abstract_mesh()
  source = mesh if context.empty else context
  return _manual_mesh(mesh.abstract_mesh if hasattr(mesh, "abstract_mesh") else mesh,
                      frozenset(auto), source.abstract_mesh)


@util.cache(max_size=1024, trace_context_in_key=False)
def _manual_mesh(mesh: AbstractMesh, auto: frozenset, source: AbstractMesh) -> AbstractMesh:
  kinds = source._name_to_type
  types = tuple(
      AxisType.Manual if n not in auto
      else (AxisType.Explicit if kinds[n] == AxisType.Explicit else AxisType.Auto)
      for n in mesh.axis_names)
  # update_axis_types keeps what else the mesh records (0.10: its device kind),
  # so avals typed inside match those JAX's own rules (e.g. for refs) produce.
  return mesh.update_axis_types(dict(zip(mesh.axis_names, types, strict=True)))


def axis_env(mesh: AnyMesh, auto: frozenset):
  """Context binding the manual axes' names and sizes for collectives."""
  return core.extend_axis_env_nd(
      [(n, mesh.shape[n]) for n in manual_axes_of(mesh, auto)])


@contextlib.contextmanager
def body_context(mesh: AnyMesh, auto: frozenset, check_rep: bool,
                 *, abstract_mesh: bool = True) -> Iterator[None]:
  """Everything a body needs while traced/evaluated per device.

  Extends the axis env with the manual axes, sets JAX's internal check_rep
  flag (which makes collectives and ``pvary`` track ``vma``) and, unless
  ``abstract_mesh=False`` (lowering), installs the manual abstract mesh.
  """
  with contextlib.ExitStack() as stack:
    stack.enter_context(axis_env(mesh, auto))
    if abstract_mesh:
      stack.enter_context(use_abstract_mesh(manual_mesh(mesh, auto)))
    stack.enter_context(check_flag(check_rep))
    yield


def mapped_size(mesh: AnyMesh, axes: tuple) -> int:
  return prod(mesh.shape[n] for n in axes)


def shard_aval(mesh: AnyMesh, auto: frozenset, check_rep: bool, names: AxisNames,
               aval: core.AbstractValue) -> core.AbstractValue:
  """Global aval -> the aval each device's body instance sees."""
  if not isinstance(aval, core.ShapedArray):
    handler = core.shard_aval_handlers.get(type(aval))  # e.g. refs
    if handler is None:
      raise NotImplementedError(f"shard_map: unsupported input type {aval}")
    return call_shard_handler(handler, mesh, auto, check_rep, names, names_to_pspec(names), aval)
  sums = partial_sums(names)
  if BODY_TYPES_PARTIAL_SUMS and sums != spec_partial_sums(aval.sharding.spec):
    raise partial_sums_mismatch("in", names, aval)
  shape = tuple(d // mapped_size(mesh, names.get(i, ()))
                for i, d in enumerate(aval.shape))
  body_mesh = manual_mesh(mesh, auto)
  # A partial sum over manual axes is the body value's type, not its sharding.
  sharding = NamedSharding(body_mesh, with_spec_partial_sums(
      aval.sharding.spec, *(frozenset(a for a in axes if a not in body_mesh.manual_axes)
                            for axes in sums)))
  vma = spec_axes(names) if vma_enabled(check_rep) else frozenset()
  if SHARD_KEEPS_OUTER_VMA:  # 0.10: still varying over an enclosing body's axes
    vma = vma | vma_of(aval)
  return with_manual_type(aval, frozenset(vma), sums if vma_enabled(check_rep) else NO_SUMS,
                          shape=shape, sharding=sharding)


def partial_sums_mismatch(kind: str, names: AxisNames, aval: core.ShapedArray) -> ValueError:
  """A spec's unreduced/reduced axes differ from the value's (jax.shard_map's wording)."""
  spec = names_to_pspec(names)
  value = spec_partial_sums(aval.sharding.spec) if kind == "in" else partial_sums_of(aval)
  label = "unreduced" if partial_sums(names)[0] != value[0] else "reduced"
  if kind == "in":
    return ValueError(
        f"in_specs containing {label} {spec} passed to shard_map should be equal to the "
        f"{label} present on the in_aval {aval.str_short(True)}")
  return ValueError(
      f"out_specs passed to shard_map should be equal to the {label} present on the "
      f"out_aval. Got out_specs={spec} and out_aval={aval.str_short(True)}")


def _merge_dim(outer, inner):
  """Combine a dim's shard_map axes with axes the body already sharded it on."""
  if outer is not None and inner is not None:
    return axis_tuple(outer) + axis_tuple(inner)
  return inner if outer is None else outer


def unshard_aval(mesh: AnyMesh, check_rep: bool, names: AxisNames,
                 aval: core.AbstractValue) -> core.AbstractValue:
  """A body output's per-device aval -> the global aval of the result."""
  if not isinstance(aval, core.ShapedArray):
    handler = core.unshard_aval_handlers.get(type(aval))
    if handler is None:
      raise NotImplementedError(f"shard_map: unsupported output type {aval}")
    return call_unshard_handler(handler, mesh, check_rep, names, names_to_pspec(names), aval)
  sums = partial_sums(names)
  if BODY_TYPES_PARTIAL_SUMS and vma_enabled(check_rep) and sums != partial_sums_of(aval):
    raise partial_sums_mismatch("out", names, aval)
  shape = tuple(d * mapped_size(mesh, names.get(i, ()))
                for i, d in enumerate(aval.shape))
  outer = names_to_pspec(names)._normalized_spec_for_aval(aval.ndim)
  if aval.ndim:
    inner = aval.sharding.spec._normalized_spec_for_aval(aval.ndim)
    spec = with_spec_partial_sums(
        PartitionSpec(*(_merge_dim(o, i) for o, i in zip(spec_entries(outer), spec_entries(inner),
                                                          strict=True))), *sums)
  else:
    spec = outer
  context = get_abstract_mesh()
  out_mesh = mesh.abstract_mesh if context.empty else context
  if vma_enabled(check_rep):
    still_manual = set(out_mesh.manual_axes)
    vma = frozenset(a for a in vma_of(aval) if a in still_manual)
  else:
    vma = frozenset()
  # The partial sum is now the result's sharding (its spec), no longer its type.
  return with_manual_type(aval, vma, NO_SUMS, shape=shape,
                          sharding=NamedSharding(out_mesh, spec))
