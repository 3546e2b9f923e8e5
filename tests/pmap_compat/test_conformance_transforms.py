"""Conformance: transformations around and inside pmap_compat vs legacy jax.pmap.

grad/jvp/vjp/linearize of collectives (psum, ppermute, all_gather, all_to_all transposes),
jit of pmap, pmap of jit, vmap of pmap, checkpoint, hessian and control flow around pmap.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pmap_compat import pmap
from references import compare_call, compare_with_legacy


def arr(*shape, dtype=np.float32):
  return (np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) * 0.25 - 1.5).astype(dtype)


PERM = [(i, (i + 1) % 8) for i in range(8)]

BODIES = {
    "psum": lambda x: lax.psum(x * x, "i"),
    "pmean": lambda x: jnp.sin(lax.pmean(x, "i")),
    "ppermute": lambda x: lax.ppermute(x, "i", PERM) * x,
    "all_gather": lambda x: lax.all_gather(x, "i") * jnp.arange(8.0)[:, None],
    "all_gather_tiled": lambda x: lax.all_gather(x, "i", tiled=True) ** 2,
    "all_to_all": lambda x: lax.all_to_all(x, "i", 0, 0) * 3,
    "psum_scatter": lambda x: lax.psum_scatter(x, "i", tiled=True) ** 2,
    "pmax": lambda x: lax.pmax(x, "i") * x,
    "axis_index": lambda x: x * lax.axis_index("i"),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow)
                                  if n in ("all_to_all", "all_gather_tiled") else n
                                  for n in sorted(BODIES)])


def test_grad_outside_pmap(name):
  def program(pm):
    f = pm(BODIES[name], axis_name="i")
    return jax.grad(lambda x: jnp.sum(f(x) ** 2))(arr(8, 8))
  compare_with_legacy(program, pmap, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["psum", "ppermute", "all_gather", "psum_scatter"])
def test_grad_inside_pmap(name):
  g = jax.grad(lambda x: jnp.sum(BODIES[name](x)))
  compare_call(g, (arr(8, 8),), pmap, axis_name="i", rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["psum", "ppermute", "all_gather", "all_to_all"])
def test_jvp_of_pmap(name):
  def program(pm):
    f = pm(BODIES[name], axis_name="i")
    return jax.jvp(f, (arr(8, 8),), (jnp.ones((8, 8)),))
  compare_with_legacy(program, pmap, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["psum", "ppermute", "all_gather"])
def test_vjp_of_pmap(name):
  def program(pm):
    f = pm(BODIES[name], axis_name="i")
    out, back = jax.vjp(f, arr(8, 8))
    return out, back(jnp.ones_like(out) * 0.5)
  compare_with_legacy(program, pmap, rtol=1e-6, atol=1e-6)


def test_linearize_of_pmap():
  def program(pm):
    f = pm(BODIES["pmean"], axis_name="i")
    y, lin = jax.linearize(f, arr(8, 3))
    return y, lin(jnp.ones((8, 3)))
  compare_with_legacy(program, pmap, rtol=1e-6, atol=1e-6)


def test_linear_transpose_of_psum():
  def program(pm):
    f = pm(lambda x: lax.psum(x, "i"), axis_name="i")
    return jax.linear_transpose(f, arr(8, 2))(jnp.ones((8, 2)))
  compare_with_legacy(program, pmap)


def test_grad_with_int_input_float0():
  def program(pm):
    f = pm(lambda x, n: x * n, axis_name="i")
    return jax.grad(lambda x, n: f(x, n).sum(), argnums=(0, 1), allow_int=True)(
        arr(8, 2), np.ones((8, 2), np.int32))
  compare_with_legacy(program, pmap)


def test_value_and_grad_of_pmap_with_aux():
  def program(pm):
    f = pm(lambda w, x: (jnp.sum((w * x) ** 2), lax.pmean(w, "i")), axis_name="i")
    loss = lambda w, x: (f(w, x)[0].sum(), f(w, x)[1])
    return jax.value_and_grad(loss, has_aux=True)(arr(8, 3), arr(8, 3))
  compare_with_legacy(program, pmap, rtol=1e-6)


def test_training_step_style():
  def step(w, x):
    g = jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w)
    g = lax.pmean(g, "batch")
    return w - 0.1 * g
  w = np.tile(arr(1, 4, 2), (8, 1, 1))
  compare_call(step, (w, arr(8, 5, 4)), pmap, axis_name="batch", rtol=1e-6, atol=1e-7)


def test_jit_of_pmap():
  def program(pm):
    f = pm(lambda x: lax.psum(x, "i") * 2, axis_name="i")
    return jax.jit(lambda x: f(x) + 1)(arr(8, 3))
  compare_with_legacy(program, pmap)


def test_jit_of_pmap_twice_in_a_row():
  def program(pm):
    f = pm(lambda x: jnp.cos(x), axis_name="i")
    return jax.jit(lambda x: f(f(x)))(arr(8, 3))
  compare_with_legacy(program, pmap)


def test_pmap_of_jit():
  inner = jax.jit(lambda x: x @ x.T)
  compare_call(lambda x: lax.psum(inner(x), "i"), (arr(8, 3, 2),), pmap, axis_name="i")


def test_pmap_of_jit_with_static_args():
  inner = jax.jit(lambda x, k: x * k, static_argnums=1)
  compare_call(lambda x: inner(x, 3), (arr(8, 3),), pmap)


def test_vmap_of_pmap():
  def program(pm):
    return jax.vmap(pm(lambda x: x * 2 + lax.axis_index("i"), axis_name="i"))(arr(3, 8, 2))
  compare_with_legacy(program, pmap)


def test_vmap_of_pmap_in_axes_none():
  def program(pm):
    f = pm(lambda x, y: x + y, in_axes=(0, None))
    return jax.vmap(f, in_axes=(None, 0))(arr(8, 2), arr(3, 2))
  compare_with_legacy(program, pmap)


def test_pmap_of_vmap():
  compare_call(jax.vmap(lambda x: jnp.dot(x, x)), (arr(8, 3, 4),), pmap)


def test_grad_of_jit_of_pmap():
  def program(pm):
    f = pm(lambda x: lax.psum(jnp.sin(x), "i"), axis_name="i")
    return jax.grad(jax.jit(lambda x: f(x).sum()))(arr(8, 2))
  compare_with_legacy(program, pmap, rtol=1e-6, atol=1e-7)


def test_checkpoint_of_pmap():
  def program(pm):
    f = pm(lambda x: jnp.sin(lax.psum(x, "i")), axis_name="i")
    return jax.grad(lambda x: jax.checkpoint(f)(x).sum())(arr(8, 2))
  compare_with_legacy(program, pmap, rtol=1e-6, atol=1e-7)


def test_checkpoint_inside_pmap():
  compare_call(jax.grad(jax.checkpoint(lambda x: jnp.sum(jnp.sin(x) ** 2))), (arr(8, 3),), pmap,
               rtol=1e-6)


@pytest.mark.slow
def test_nested_pmap_grad():
  def program(pm):
    f = pm(pm(lambda x: lax.psum(x ** 2, ("i", "j")), axis_name="j"), axis_name="i")
    return jax.grad(lambda x: f(x).sum())(arr(4, 2, 3))
  compare_with_legacy(program, pmap, rtol=1e-6)


def test_scan_over_pmap():
  def program(pm):
    f = pm(lambda c: lax.psum(c, "i") * 0.1, axis_name="i")
    return lax.scan(lambda c, _: (f(c), c.sum()), arr(8, 2), None, length=3)
  compare_with_legacy(program, pmap, rtol=1e-6)


@pytest.mark.slow
def test_hessian_of_pmap():
  def program(pm):
    f = pm(lambda x: jnp.sin(x) * lax.psum(x, "i"), axis_name="i")
    return jax.hessian(lambda x: f(x).sum())(arr(8))
  compare_with_legacy(program, pmap, rtol=1e-5, atol=1e-6)


# Transposes of grouped collectives, and transformations of collectives inside the body.
GROUPS = [[0, 1, 2, 3], [4, 5, 6, 7]]
GROUPED_AND_INSIDE = {
 "grad_psum_groups": lambda pm: jax.grad(lambda x: pm(lambda v: lax.psum(v ** 2, "i", axis_index_groups=GROUPS), axis_name="i")(x).sum())(arr(8, 2)),
 "grad_all_gather_groups": lambda pm: jax.grad(lambda x: (pm(lambda v: lax.all_gather(v, "i", axis_index_groups=GROUPS), axis_name="i")(x) ** 2).sum())(arr(8, 2)),
 "vmap_ppermute_inside": lambda pm: pm(jax.vmap(lambda v: lax.ppermute(v, "i", [(0, 1), (1, 0)])), axis_name="i")(arr(2, 3, 2)),
 "vmap_all_to_all_inside": lambda pm: pm(jax.vmap(lambda v: lax.all_to_all(v, "i", 0, 0)), axis_name="i")(arr(8, 3, 8)),
 "vmap_all_gather_inside": lambda pm: pm(jax.vmap(lambda v: lax.all_gather(v, "i"), in_axes=1, out_axes=1), axis_name="i")(arr(8, 2, 3)),
 "jvp_ppermute_inside": lambda pm: pm(lambda x: jax.jvp(lambda v: lax.ppermute(v, "i", [(i, (i+1) % 8) for i in range(8)]), (x,), (x * 2,)), axis_name="i")(arr(8, 2)),
 "linearize_inside": lambda pm: pm(lambda x: jax.linearize(lambda v: jnp.sin(lax.psum(v, "i")), x)[1](x), axis_name="i")(arr(8, 2)),
 "vjp_all_to_all_inside": lambda pm: pm(lambda x: jax.vjp(lambda v: lax.all_to_all(v, "i", 0, 0), x)[1](x * 3), axis_name="i")(arr(8, 8)),
 "hessian_inside": lambda pm: pm(jax.hessian(lambda v: jnp.sum(jnp.sin(v) * lax.psum(v, "i"))), axis_name="i")(arr(8, 3)),
 "grad_pmax": lambda pm: jax.grad(lambda x: pm(lambda v: lax.pmax(v, "i"), axis_name="i")(x).sum())(arr(8, 2)),
 "psum_scatter_grad_groups": lambda pm: jax.grad(lambda x: (pm(lambda v: lax.psum_scatter(v, "i", axis_index_groups=GROUPS, tiled=True), axis_name="i")(x) ** 2).sum())(arr(8, 4)),
 "pswapaxes_grad": lambda pm: jax.grad(lambda x: (pm(lambda v: lax.pswapaxes(v, "i", 0), axis_name="i")(x) ** 3).sum())(arr(8, 8)),
 "pmap_static_and_in_axes_none": lambda pm: pm(lambda x, n, y: x * n + y, in_axes=(0, None, None), static_broadcasted_argnums=1)(arr(8, 2), 2, arr(2)),
 "in_axes_none_kw_mixed": lambda pm: pm(lambda x, y, *, z: x + y + z, in_axes=(0, None))(arr(8, 2), arr(2), z=arr(8, 2)),
}


@pytest.mark.parametrize("name", sorted(GROUPED_AND_INSIDE))
def test_grouped_and_inside(name):
  compare_with_legacy(GROUPED_AND_INSIDE[name], pmap, rtol=1e-6, atol=1e-6)
