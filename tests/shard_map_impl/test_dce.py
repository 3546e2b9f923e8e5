"""Dead-code elimination of shard_map equations, equation for equation with JAX's.

After ``pe.dce_jaxpr`` a shard_map equation of ours keeps exactly the body
equations JAX's keeps, and code that walks ``params['jaxpr']`` and its
sub-jaxprs recursively (as JAX's own tests and ``jax._src.test_util.iter_eqns``
do) counts the same equations: our device witness is never inside a body.
"""
from __future__ import annotations

import itertools
from functools import partial

import jax
import jax.numpy as jnp
import pytest
from jax._src import core
from jax._src.interpreters import partial_eval as pe
from jax.sharding import AbstractMesh, PartitionSpec as P

import shard_map_impl
from reference import jax_shard_map
from support.jax_lines import has
from support.meshes import make_mesh

IMPLS = {"jax": jax_shard_map, "ours": shard_map_impl.shard_map}


def iter_eqns(jaxpr: core.Jaxpr):
  yield from jaxpr.eqns
  for sub in core.subjaxprs(jaxpr):
    yield from iter_eqns(sub)


def three_outputs(sm, mesh):
  """JAX's own DCE test program: three outputs, one closing over a traced value."""
  def f(x, y, z):
    @partial(sm, mesh=mesh, in_specs=(P("x", "y"), P(None, "x")),
             out_specs=(P(None, None), P(None, "x"), P("x", "y")))
    def g(y, z):
      return jnp.sin(x), jnp.cos(z), jnp.tan(y)
    return g(y, z)
  return jax.make_jaxpr(f)(jnp.zeros((4, 4)), jnp.zeros((8, 8)), jnp.zeros((16, 16))).jaxpr


def nested(sm, mesh):
  """An outer shard_map over x whose body holds an inner one over y.

  The inner one names the full mesh on 0.6, the context mesh (x already
  manual) on 0.10, as each line's JAX requires."""
  def body(a, b):
    inner_mesh = mesh if not has("core_shard_map") else jax.sharding.get_abstract_mesh()
    inner = sm(lambda v, w: (jnp.sin(v), jnp.cos(w) * 2), inner_mesh,
               in_specs=(P(), P()), out_specs=(P(), P()))
    s, c = inner(a, b)
    return s + 1, c
  outer = sm(body, mesh, in_specs=(P("x"), P("x")), out_specs=(P("x"), P("x")))
  return jax.make_jaxpr(outer)(jnp.ones((8, 4)), jnp.ones((8, 4))).jaxpr


def shape_of(jaxpr: core.Jaxpr, used: list[bool]) -> tuple:
  pruned, used_inputs = pe.dce_jaxpr(jaxpr, used)
  return (used_inputs, len(pruned.eqns),
          [len(e.params["jaxpr"].eqns) for e in pruned.eqns],
          [sum(1 for _ in iter_eqns(e.params["jaxpr"])) for e in pruned.eqns])


PROGRAMS = {"three_outputs": (three_outputs, 3), "nested": (nested, 2)}
CASES = [(name, list(used)) for name, (_, n) in PROGRAMS.items()
         for used in itertools.product([True, False], repeat=n)]


@pytest.mark.parametrize("name,used", CASES, ids=[
    f"{n}-{''.join('1' if b else '0' for b in u)}" for n, u in CASES])
def test_dce_keeps_the_body_equations_jax_keeps(name, used):
  mesh = make_mesh((4, 2))
  build, _ = PROGRAMS[name]
  shapes = {k: shape_of(build(sm, mesh), used) for k, sm in IMPLS.items()}
  assert shapes["ours"] == shapes["jax"]


def test_recursive_count_matches_jax_on_an_abstract_mesh():
  """No concrete devices, no witness: the whole program counts like JAX's."""
  mesh = AbstractMesh((4, 2), ("x", "y"))
  counts = {}
  for k, sm in IMPLS.items():
    jaxpr = three_outputs(sm, mesh)
    counts[k] = [sum(1 for _ in iter_eqns(pe.dce_jaxpr(jaxpr, used)[0]))
                 for used in ([True] * 3, [True, False, False], [False] * 3)]
  assert counts["ours"] == counts["jax"]


def test_nested_equations_carry_no_witness():
  """Only the outermost equation names the devices for jit."""
  mesh = make_mesh((4, 2))
  outer, = nested(shard_map_impl.shard_map, mesh).eqns
  assert "device_witness" in outer.params
  inner = [e for e in outer.params["jaxpr"].eqns if e.primitive is shard_map_impl.shard_map_p]
  assert len(inner) == 1 and "device_witness" not in inner[0].params
