"""jax 0.10's ``jax.shard_map`` call form, differentially against JAX 0.10.2 itself:
decorator factory, context mesh, ``axis_names``, ``check_vma=False``, inferred
``in_specs``, and the errors of that form.  On both lines: the two call forms of
ours agree with each other."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import shard_map_impl
from support.compare import assert_trees_equal
from support.jax_lines import requires
from support.meshes import make_mesh

lax = jax.lax
X = np.arange(32.0, dtype=np.float32).reshape(8, 4)


def _auto_mesh():
  return make_mesh((4, 2))


def _explicit_mesh():
  return jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)


def _run(build, sm, jit: bool):
  """('ok', outputs, shardings) or ('err', exception) of one program."""
  try:
    fun, args = build(sm)
    out = jax.block_until_ready((jax.jit(fun) if jit else fun)(*args))
  except Exception as e:  # noqa: BLE001 - differential: compare the exceptions
    return ("err", e)
  return ("ok", out, [getattr(o, "sharding", None) for o in jax.tree.leaves(out)])


def _with_mesh(mesh, build):
  """``build`` run with ``mesh`` as the context mesh (jax.set_mesh)."""
  def run(sm):
    fun, args = build(sm)
    def call(*a):
      with jax.set_mesh(mesh):
        return fun(*a)
    return call, args
  return run


def _with_ref(sm):
  """A mutable array (jax.new_ref) made outside the body, passed in sharded."""
  def body(x, ref):
    ref[...] = ref[...] + x
    return ref[...] * 2
  def program(x):
    ref = jax.new_ref(np.zeros(X.shape, np.float32))
    return sm(body, mesh=_auto_mesh(), in_specs=(P("x"), P("x")), out_specs=P("x"))(x, ref)
  return program


def _explicit_args():
  mesh = _explicit_mesh()
  return mesh, jax.device_put(X, NamedSharding(mesh, P("x", "y")))


def _on_explicit_mesh(build, spec: tuple = ("x", "y")):
  """``build(sm, mesh)`` applied to an argument sharded as ``spec`` over the Explicit
  mesh's axes."""
  def run(sm):
    mesh = _explicit_mesh()
    return build(sm, mesh), (jax.device_put(X, NamedSharding(mesh, P(*spec))),)
  return run


def _callback_two_results(sm, mesh):
  """A host callback with two results in the body (typed on the body's mesh)."""
  def body(a):
    spec = jax.ShapeDtypeStruct.like(a)
    return jax.pure_callback(lambda v: (v + 1, v * 2), (spec, spec), a)
  return sm(body, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P("x")))


def _whole_mesh_inside_partial_body(sm):
  """The whole concrete mesh passed again inside a body manual over x only."""
  def body(a):
    return sm(lambda b: b * b, mesh=_auto_mesh(), in_specs=P(None, "y"),
              out_specs=P(None, "y"))(a)
  return sm(body, mesh=_auto_mesh(), in_specs=P("x"), out_specs=P("x"), axis_names={"x"},
            check_vma=False)


PROGRAMS = {
    "decorator_factory": lambda sm: (
        sm(out_specs=P("x"), mesh=_auto_mesh(), in_specs=P("x"))(lambda a: a * 2), (X,)),
    "context_mesh": _with_mesh(_auto_mesh(), lambda sm: (
        sm(lambda a: lax.psum(a, "x"), in_specs=P("x"), out_specs=P()), (X,))),
    "context_mesh_decorator": _with_mesh(_auto_mesh(), lambda sm: (
        sm(in_specs=P("x", "y"), out_specs=P("x"))(lambda a: lax.psum(a, "y")), (X,))),
    "axis_names_subset": lambda sm: (
        sm(lambda a: a + 1, mesh=_auto_mesh(), in_specs=P("x"), out_specs=P("x"),
           axis_names={"x"}), (X,)),
    "axis_names_collective": lambda sm: (
        sm(lambda a: lax.psum(a, "x"), mesh=_auto_mesh(), in_specs=P("x"), out_specs=P(),
           axis_names=frozenset({"x"})), (X,)),
    "check_vma_false": lambda sm: (
        sm(lambda a: a, mesh=_auto_mesh(), in_specs=P("x"), out_specs=P(), check_vma=False),
        (X[:2],)),
    "check_vma_false_psum": lambda sm: (
        sm(lambda a: lax.psum(a, "x"), mesh=_auto_mesh(), in_specs=P("x"), out_specs=P(),
           check_vma=False), (X,)),
    "inferred_in_specs": lambda sm: (
        lambda mesh, xe: (sm(lambda a: a * 2, mesh=mesh, out_specs=P("x", "y")), (xe,)))(
            *_explicit_args()),
    "inferred_in_specs_psum": lambda sm: (
        lambda mesh, xe: (sm(lambda a: lax.psum(a, ("x", "y")), mesh=mesh, out_specs=P()),
                          (xe,)))(*_explicit_args()),
    "ref_operand": lambda sm: (_with_ref(sm), (X,)),
    "err_mesh_differs_from_context_mesh": _with_mesh(make_mesh((8,)), lambda sm: (
        sm(lambda a: a, mesh=_auto_mesh(), in_specs=P("x"), out_specs=P("x")), (X,))),
    # Explicit axes left to the compiler (partially manual, or spent by a vmap) stay in
    # the body's types and the results' shardings.
    "partial_manual_explicit_x": _on_explicit_mesh(lambda sm, mesh: sm(
        lambda a: a * 2, mesh=mesh, out_specs=P("x"), axis_names={"x"})),
    "partial_manual_explicit_y": _on_explicit_mesh(lambda sm, mesh: sm(
        lambda a: a * 2, mesh=mesh, out_specs=P(None, "y"), axis_names={"y"})),
    "pure_callback_two_results": _on_explicit_mesh(_callback_two_results, ("x",)),
    # errors of this call form
    "err_whole_mesh_inside_partial_body": lambda sm: (_whole_mesh_inside_partial_body(sm), (X,)),
    "err_not_replicated": lambda sm: (
        sm(lambda a: a, mesh=_auto_mesh(), in_specs=P("x"), out_specs=P()), (X,)),
    "err_not_replicated_two_axes": lambda sm: (
        sm(lambda a: a, mesh=_auto_mesh(), in_specs=P("x", "y"), out_specs=P()), (X,)),
    "err_unknown_spec_axis": lambda sm: (
        sm(lambda a: a, mesh=_auto_mesh(), in_specs=P("z"), out_specs=P()), (X,)),
    "err_in_specs_cannot_be_inferred": lambda sm: (
        sm(lambda a: a, mesh=_auto_mesh(), out_specs=P()), (X,)),
    "err_no_context_mesh": lambda sm: (sm(lambda a: a, in_specs=P("x"), out_specs=P()), (X,)),
    "err_axis_names_not_subset": lambda sm: (
        sm(lambda a: a, mesh=_auto_mesh(), in_specs=P("x"), out_specs=P("x"),
           axis_names={"q"}), (X,)),
    "err_axis_names_wrong_type": lambda sm: (
        sm(lambda a: a, mesh=_auto_mesh(), in_specs=P("x"), out_specs=P("x"),
           axis_names=["x"]), (X,)),
    "err_spec_names_auto_axis": lambda sm: (
        sm(lambda a: a, mesh=_auto_mesh(), in_specs=P("y"), out_specs=P("x"),
           axis_names={"x"}), (X,)),
    "err_in_specs_none": lambda sm: (
        sm(lambda a: a, mesh=_auto_mesh(), in_specs=None, out_specs=P()), (X,)),
}

# A ref is made inside a jit.
JIT_ONLY = {"ref_operand"}

# A vmap whose batch dimension is sharded over an Explicit mesh axis: that axis stays
# with the compiler (the body is manual over the rest), so results keep it.
VMAP_PROGRAMS = {
    "vmap_over_explicit_axis": _on_explicit_mesh(lambda sm, mesh: jax.vmap(sm(
        lambda a: a, mesh=mesh, in_specs=P("y"), out_specs=P("y")))),
    "vmap_over_explicit_axis_psum": _on_explicit_mesh(lambda sm, mesh: jax.vmap(sm(
        lambda a: lax.psum(a, "y"), mesh=mesh, in_specs=P("y"), out_specs=P()))),
}


@requires("core_shard_map", "its call form is the reference's own")
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_matches_jax_shard_map(name, jit):
  if not jit and name in JIT_ONLY:
    pytest.skip("made inside a jit: tested under jit")
  _compare_with_jax(PROGRAMS[name], jit)


@requires("explicit_vmap_axes", "vmap hides the Explicit axes it spends from shard_map")
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("name", sorted(VMAP_PROGRAMS))
def test_vmap_over_explicit_axes_matches_jax_shard_map(name, jit):
  _compare_with_jax(VMAP_PROGRAMS[name], jit)


def _compare_with_jax(build, jit: bool) -> None:
  ref = _run(build, jax.shard_map, jit)
  ours = _run(build, shard_map_impl.shard_map, jit)
  if ref[0] == "err":
    assert ours[0] == "err", f"JAX raised {ref[1]!r}; ours returned {ours[1]!r}"
    assert type(ours[1]) is type(ref[1]), f"JAX raised {ref[1]!r}\nours raised {ours[1]!r}"
    if jit:  # eagerly, JAX's replication errors name its own helper, not the function
      assert str(ours[1]) == str(ref[1])
    return
  assert ours[0] == "ok", f"JAX returned a value; ours raised {ours[1]!r}"
  assert_trees_equal(ref[1], ours[1])
  for r, o in zip(ref[2], ours[2], strict=True):
    assert r == o, f"output sharding {o} differs from JAX's {r}"


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
def test_both_call_forms_agree(jit):
  mesh = _auto_mesh()
  body = lambda a, b: (lax.psum(a * b, "y"), a)
  legacy = shard_map_impl.shard_map(body, mesh, (P("x", "y"), P()), (P("x"), P("x", "y")),
                                    check_rep=True)
  new = shard_map_impl.shard_map(body, mesh=mesh, in_specs=(P("x", "y"), P()),
                                 out_specs=(P("x"), P("x", "y")), check_vma=True)
  wrap = jax.jit if jit else (lambda f: f)
  assert_trees_equal(wrap(legacy)(X, np.float32(2)), wrap(new)(X, np.float32(2)))
  assert str(jax.make_jaxpr(legacy)(X, np.float32(2))) == str(
      jax.make_jaxpr(new)(X, np.float32(2)))


@pytest.mark.parametrize("kwargs,match", [
    (dict(check_vma=True, check_rep=True), "not both"),
    (dict(axis_names={"x"}, auto=frozenset({"y"})), "not both"),
])
def test_mixing_the_forms_is_rejected(kwargs, match):
  with pytest.raises(TypeError, match=match):
    shard_map_impl.shard_map(lambda a: a, mesh=_auto_mesh(), in_specs=P("x"),
                             out_specs=P("x"), **kwargs)


def test_out_specs_is_required():
  with pytest.raises(TypeError, match="out_specs"):
    shard_map_impl.shard_map(lambda a: a, mesh=_auto_mesh(), in_specs=P("x"))


def test_empty_mesh_is_rejected():
  empty = jax.sharding.Mesh(np.empty((), dtype=object), ())
  with pytest.raises(ValueError, match="shard_map requires a non-empty mesh"):
    shard_map_impl.shard_map(lambda a: a, mesh=empty, in_specs=P("x"), out_specs=P("x"))(X)


def _nested_program(outer, inner):
  """Outer manual over x; inside, the context mesh's y made manual too."""
  def body(v):
    return inner(lambda w: lax.psum(w, "y"), in_specs=P(None, "y"), out_specs=P(),
                 axis_names={"y"})(v)
  return outer(body, mesh=_auto_mesh(), in_specs=P("x"), out_specs=P("x"), axis_names={"x"})


@requires("core_shard_map", "context-mesh nesting with JAX's own")
@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("outer,inner", [("ours", "jax"), ("jax", "ours"), ("ours", "ours")])
def test_nested_with_jax_shard_map_either_way(outer, inner, jit):
  impls = {"ours": shard_map_impl.shard_map, "jax": jax.shard_map}
  wrap = jax.jit if jit else (lambda f: f)
  try:
    expected = wrap(_nested_program(jax.shard_map, jax.shard_map))(X)
  except NotImplementedError:  # JAX's eager shard_map without partially manual support
    with pytest.raises(NotImplementedError):
      wrap(_nested_program(impls[outer], impls[inner]))(X)
    return
  got = wrap(_nested_program(impls[outer], impls[inner]))(X)
  assert_trees_equal(expected, got)
  assert got.sharding == expected.sharding
