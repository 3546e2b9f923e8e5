"""Places where JAX special-cases its own shard_map, made to work for ours.

* Device assignment: ``jit`` learns which devices a computation uses from
  argument shardings and from shardings *inside* the jaxpr
  (``dispatch.get_intermediate_shardings``, which knows JAX's shard_map but
  not ours).  That function also walks every sub-jaxpr found in equation
  params, so each staged equation of ours on a concrete ``Mesh`` carries a
  ``device_witness`` param: a one-equation jaxpr holding a
  ``sharding_constraint`` on that mesh.  Nothing in JAX is modified.
* checkify and key-reuse checking: entries keyed by our primitive (see the
  end of this module).
"""
from __future__ import annotations

import itertools

from jax._src import core
from jax._src import pjit
from jax._src import source_info_util
from jax._src.mesh import Mesh
from jax.sharding import NamedSharding, PartitionSpec

_witness_eqn_cache: dict = {}


def _witness_eqn(mesh: Mesh) -> core.JaxprEqn:
  """A ``sharding_constraint`` equation on a replicated scalar over ``mesh``."""
  eqn = _witness_eqn_cache.get(mesh)
  if eqn is None:
    import jax
    import jax.numpy as jnp
    sharding = NamedSharding(mesh, PartitionSpec())
    closed = jax.make_jaxpr(lambda x: jax.lax.with_sharding_constraint(x, sharding))(
        jax.ShapeDtypeStruct((), jnp.float32))
    eqn, = closed.jaxpr.eqns
    assert eqn.primitive is pjit.sharding_constraint_p
    eqn = eqn.replace(source_info=source_info_util.new_source_info())
    _witness_eqn_cache[mesh] = eqn
  return eqn


def device_witness(mesh) -> core.Jaxpr | None:
  """A fresh witness jaxpr for ``mesh`` (None for an AbstractMesh).

  Fresh per equation so the pretty-printer never sees it shared (shared
  sub-jaxprs get hoisted out and printed separately).
  """
  if not isinstance(mesh, Mesh):
    return None
  eqn = _witness_eqn(mesh)
  return core.Jaxpr(constvars=(), invars=list(eqn.invars),
                    outvars=list(eqn.outvars), eqns=[eqn])
