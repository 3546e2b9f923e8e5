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

from shard_map_impl.jax_line import (SHARD_KEEPS_OUTER_VMA, call_shard_handler, call_unshard_handler, check_flag,
                                     varying_axes_typed, vma_of, with_vma)
from shard_map_impl.specs import AnyMesh, AxisNames, axis_tuple, names_to_pspec, spec_axes

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
  shape = tuple(d // mapped_size(mesh, names.get(i, ()))
                for i, d in enumerate(aval.shape))
  sharding = NamedSharding(manual_mesh(mesh, auto), aval.sharding.spec)
  vma = spec_axes(names) if vma_enabled(check_rep) else frozenset()
  if SHARD_KEEPS_OUTER_VMA:  # 0.10: still varying over an enclosing body's axes
    vma = vma | vma_of(aval)
  return with_vma(aval, frozenset(vma), shape=shape, sharding=sharding)


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
  shape = tuple(d * mapped_size(mesh, names.get(i, ()))
                for i, d in enumerate(aval.shape))
  outer = names_to_pspec(names)._normalized_spec_for_aval(aval.ndim)
  if aval.ndim:
    inner = aval.sharding.spec._normalized_spec_for_aval(aval.ndim)
    spec = PartitionSpec(*(_merge_dim(o, i) for o, i in zip(outer, inner, strict=True)))
  else:
    spec = outer
  context = get_abstract_mesh()
  out_mesh = mesh.abstract_mesh if context.empty else context
  if vma_enabled(check_rep):
    still_manual = set(out_mesh.manual_axes)
    vma = frozenset(a for a in vma_of(aval) if a in still_manual)
  else:
    vma = frozenset()
  return with_vma(aval, vma, shape=shape, sharding=NamedSharding(out_mesh, spec))
