"""DebugInfo of the jaxprs shard_map_impl stages, against JAX's shard_map.

Every shard_map body in a program (staged, differentiated, batched, remat-ed,
linearized, transposed) carries a DebugInfo naming the user's function and
source, like JAX's.  Where JAX's names line up with the body's inputs and
outputs, ours are the same names; ours always line up (JAX 0.6.0 keeps stale
names on some derived bodies, which its own ``safe_arg_names`` reads as
unknown).  Errors raised while tracing a body name the user's argument as
JAX's do.
"""
from __future__ import annotations

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import api_util
from jax._src import core
from jax.sharding import PartitionSpec as P

import shard_map_impl
from reference import (jax_shard_map, jax_shard_map_p, outcomes_or_same_error, vma_mode,
                       vma_params)
from support.meshes import make_mesh

IMPLS = {"jax": jax_shard_map, "ours": shard_map_impl.shard_map}
PRIMITIVES = (jax_shard_map_p, shard_map_impl.shard_map_p)


def shard_map_bodies(jaxpr: core.Jaxpr) -> list[core.Jaxpr]:
  """Bodies of every shard_map equation, in program order, recursively."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive in PRIMITIVES:
      found.append(eqn.params["jaxpr"])
    for sub in core.jaxprs_in_params(eqn.params):
      found.extend(shard_map_bodies(sub))
  return found


def lined_up(body: core.Jaxpr) -> bool:
  dbg = body.debug_info
  return (dbg.arg_names is not None and len(dbg.arg_names) == len(body.invars)
          and isinstance(dbg.result_paths, tuple)
          and len(dbg.result_paths) == len(body.outvars))


def weighted_sum(w, xs):
  return jax.lax.psum(jnp.sin(xs) * w, "x")


def _programs(sm, mesh):
  g = sm(weighted_sum, mesh, in_specs=(P(), P("x")), out_specs=P())
  loss = lambda w, xs: g(w, xs).sum()
  return {
      "jit": (g, 2),
      "grad": (jax.grad(loss), 2),
      "grad_both": (jax.grad(loss, argnums=(0, 1)), 2),
      "vmap": (jax.vmap(g, in_axes=(0, None)), 2),
      "remat": (jax.grad(jax.checkpoint(loss)), 2),
      "linearize": (lambda w, xs: jax.linearize(g, w, xs)[1](w, xs), 2),
      "vjp": (lambda w, xs: jax.vjp(g, w, xs)[1](g(w, xs)), 2),
  }


PROGRAMS = list(_programs(jax_shard_map, make_mesh((4, 2))))


def _args(name):
  w, xs = jnp.ones((2,)), jnp.arange(16.0).reshape(8, 2)
  return (jnp.ones((3, 2)), xs) if name == "vmap" else (w, xs)


def bodies_of(name: str, vma: bool) -> dict[str, list[core.Jaxpr]] | None:
  """Each implementation's shard_map bodies (None where JAX's own fails alike)."""
  mesh = make_mesh((4, 2))
  with vma_mode(vma), warnings.catch_warnings():
    warnings.simplefilter("error", DeprecationWarning)
    return outcomes_or_same_error(IMPLS, lambda sm: shard_map_bodies(
        jax.make_jaxpr(_programs(sm, mesh)[name][0])(*_args(name)).jaxpr))


@pytest.mark.parametrize("vma", vma_params(True, False), ids=["vma", "novma"])
@pytest.mark.parametrize("name", PROGRAMS)
def test_body_debug_info_matches_jax(name, vma):
  bodies = bodies_of(name, vma)
  if bodies is None:
    return  # JAX's own shard_map fails on this program, and ours the same way
  assert len(bodies["ours"]) == len(bodies["jax"])
  for theirs, ours in zip(bodies["jax"], bodies["ours"], strict=True):
    t, o = theirs.debug_info, ours.debug_info
    assert o.traced_for == t.traced_for == "shard_map"
    assert o.func_src_info == t.func_src_info
    assert o.func_name == "weighted_sum"
    assert lined_up(ours), (o, len(ours.invars), len(ours.outvars))
    same_shape = (len(theirs.invars), len(theirs.outvars)) == (len(ours.invars),
                                                               len(ours.outvars))
    if same_shape and lined_up(theirs):
      assert (o.arg_names, o.result_paths) == (t.arg_names, t.result_paths)


def test_user_facing_body_names_arguments_and_results():
  mesh = make_mesh((4, 2))
  def f(weights, data):
    return {"total": weighted_sum(weights, data["xs"])}
  names = {}
  for impl, sm in IMPLS.items():
    g = sm(f, mesh, in_specs=(P(), {"xs": P("x")}), out_specs={"total": P()})
    body, = shard_map_bodies(jax.make_jaxpr(g)(jnp.ones(2), {"xs": jnp.ones((8, 2))}).jaxpr)
    names[impl] = (body.debug_info.arg_names, body.debug_info.result_paths)
  assert names["ours"][0] == names["jax"][0]
  # Result paths as JAX's where it knows them (JAX 0.8-0.9.0's shard_map leaves its
  # body's unknown, None; ours name them there too, as the module docstring says).
  if names["jax"][1] is not None:
    assert names["ours"][1] == names["jax"][1]
  # Older shard_maps name results by their path, newer ones by flat position.
  assert names["ours"][0] == ("weights", "data['xs']")
  assert names["ours"][1] in (("result['total']",), ("result[0]",))


def test_unmapped_arguments_are_not_named_in_the_body():
  """An argument with spec None is not a body input; the names say so."""
  mesh = make_mesh((8,))
  g = shard_map_impl.shard_map(lambda scale, x: x * scale, mesh,
                               in_specs=(None, P("x")), out_specs=P("x"))
  body, = shard_map_bodies(jax.make_jaxpr(lambda x: g(2.0, x))(jnp.ones(8)).jaxpr)
  assert len(body.invars) == 1 and body.debug_info.arg_names == ("x",)


def test_every_sub_jaxpr_has_debug_info():
  """Including the device witness: no missing-DebugInfo warning, real names."""
  mesh = make_mesh((8,))
  with warnings.catch_warnings():
    warnings.simplefilter("error", DeprecationWarning)
    g = shard_map_impl.shard_map(jnp.sin, mesh, in_specs=P("x"), out_specs=P("x"))
    jaxpr = jax.make_jaxpr(jax.grad(lambda x: g(x).sum()))(jnp.ones(8)).jaxpr
  for eqn in jaxpr.eqns:
    for sub in core.jaxprs_in_params(eqn.params):
      assert sub.debug_info.traced_for != "missing_debug_info"


def _concretization_message(sm, transform, x) -> str:
  mesh = make_mesh((8,))
  def body(values):
    if values.sum() > 0:  # needs a concrete value: fails while tracing
      return values
    return -values
  g = sm(body, mesh, in_specs=P("x"), out_specs=P("x"))
  with pytest.raises(jax.errors.ConcretizationTypeError) as info:
    transform(g)(x)
  return re.sub(r"\d{9,}", "<id>", str(info.value))  # trace ids differ per run


TRANSFORMS = {
    "jit": (jax.jit, jnp.ones(8)),
    "jit_grad": (lambda g: jax.jit(jax.grad(lambda x: g(x).sum())), jnp.ones(8)),
    "jit_vmap": (lambda g: jax.jit(jax.vmap(g)), jnp.ones((2, 8))),
}


@pytest.mark.parametrize("name", TRANSFORMS)
def test_tracing_errors_name_the_function_and_argument(name):
  transform, x = TRANSFORMS[name]
  theirs = _concretization_message(jax_shard_map, transform, x)
  ours = _concretization_message(shard_map_impl.shard_map, transform, x)
  assert ours == theirs
  assert "body" in ours  # the error names the user's function


def test_dce_keeps_names_of_what_remains():
  from jax._src.interpreters import partial_eval as pe
  mesh = make_mesh((4, 2))
  def f(a, b):
    return jnp.sin(a), jnp.cos(b)
  g = shard_map_impl.shard_map(f, mesh, in_specs=(P("x"), P("y")),
                               out_specs=(P("x"), P("y")))
  jaxpr = jax.make_jaxpr(g)(np.ones(8), np.ones(4)).jaxpr
  pruned, _ = pe.dce_jaxpr(jaxpr, [False, True])
  body = pruned.eqns[0].params["jaxpr"]
  assert body.debug_info.arg_names == ("b",)
  assert body.debug_info.result_paths == ("result[1]",)


def test_a_given_debug_info_names_the_api_in_tracing_errors():
  """``debug_info=`` (what pmap_compat passes): JAX's message, with that API's name."""
  def with_name(traced_for):
    def sm(f, mesh, **kw):
      return lambda x: shard_map_impl.shard_map(
          f, mesh, **kw, debug_info=api_util.debug_info(traced_for, f, (x,), {}))(x)
    return sm
  theirs = _concretization_message(jax_shard_map, jax.jit, jnp.ones(8))
  assert _concretization_message(with_name("shard_map"), jax.jit, jnp.ones(8)) == theirs
  ours = _concretization_message(with_name("my_map"), jax.jit, jnp.ones(8))
  assert ours == theirs.replace(" for shard_map.", " for my_map.")
  assert ours != theirs


def test_debug_info_argument_is_checked():
  mesh = make_mesh((8,))
  with pytest.raises(TypeError, match="debug_info"):
    shard_map_impl.shard_map(jnp.sin, mesh, in_specs=P("x"), out_specs=P("x"), debug_info="f")
  two_names = api_util.debug_info("shard_map", jnp.add, (1.0, 2.0), {})
  g = shard_map_impl.shard_map(jnp.sin, mesh, in_specs=P("x"), out_specs=P("x"),
                               debug_info=two_names)
  with pytest.raises(ValueError, match="debug_info names 2 arguments"):
    g(jnp.ones(8))
