"""Telling ``jit`` which devices a shard_map on a concrete ``Mesh`` runs on.

``jit`` learns the devices of a computation from its argument shardings and
from shardings *inside* its jaxpr (``dispatch.get_intermediate_shardings``,
which knows JAX's shard_map but not ours).  That function also walks every
sub-jaxpr found in equation params, so a staged equation of ours on a concrete
``Mesh`` carries a ``device_witness`` param: a one-equation jaxpr holding a
``sharding_constraint`` on that mesh.  Nothing in JAX is modified.

Only the outermost shard_map needs one: inside a shard_map body (ours or
JAX's) the enclosing equation already names the devices, so nested equations
carry no witness and their bodies look exactly like JAX's to code that walks
sub-jaxprs.
"""
from __future__ import annotations

from typing import Any

import jax
from jax._src import core
from jax._src import pjit
from jax._src import source_info_util
from jax._src import util
from jax._src.mesh import AbstractMesh, AxisType, Mesh, get_abstract_mesh, use_abstract_mesh
from jax.sharding import NamedSharding, PartitionSpec

from shard_map_impl.specs import AnyMesh

WITNESS_PARAM = "device_witness"


def _constrain_to_mesh(x: Any, sharding: NamedSharding):
  return jax.lax.with_sharding_constraint(x, sharding)


@util.cache(max_size=256, trace_context_in_key=False)
def _witness_parts(mesh: Mesh) -> tuple[core.JaxprEqn, core.DebugInfo]:
  """A ``sharding_constraint`` equation on a replicated scalar over ``mesh``."""
  # Traced with Auto axes outside any mesh context: under an Explicit context
  # mesh the constraint would be folded away, and only the devices matter.
  devices_only = Mesh(mesh.devices, mesh.axis_names,
                      axis_types=(AxisType.Auto,) * len(mesh.axis_names))
  sharding = NamedSharding(devices_only, PartitionSpec())
  with use_abstract_mesh(AbstractMesh((), ())):
    closed = jax.make_jaxpr(_constrain_to_mesh, static_argnums=1)(
        jax.ShapeDtypeStruct((), jax.numpy.float32), sharding)
  eqn, = closed.jaxpr.eqns
  assert eqn.primitive is pjit.sharding_constraint_p
  # The sharding jit reads back is on ``mesh`` itself, axis types included: a program
  # that needs its devices (a host callback) requires one abstract mesh throughout.
  eqn = eqn.replace(params={**eqn.params, "sharding": NamedSharding(mesh, PartitionSpec())},
                    source_info=source_info_util.new_source_info())
  return eqn, closed.jaxpr.debug_info


def _inside_a_body() -> bool:
  """Whether we are tracing inside a shard_map body (some axes are manual)."""
  return bool(get_abstract_mesh().manual_axes)


def witness_for(mesh: AnyMesh) -> core.Jaxpr | None:
  """A fresh witness jaxpr for ``mesh``, or None where none is needed.

  None for an ``AbstractMesh`` (no devices to name) and inside a shard_map
  body.  Fresh per equation so the pretty-printer never sees it shared
  (shared sub-jaxprs get hoisted out and printed separately).
  """
  if not isinstance(mesh, Mesh) or _inside_a_body():
    return None
  eqn, debug_info = _witness_parts(mesh)
  return core.Jaxpr(constvars=(), invars=list(eqn.invars),
                    outvars=list(eqn.outvars), eqns=[eqn], debug_info=debug_info)
