"""Transformations around and inside pmap_compat.pmap (rows 4, 16-18, 32)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pmap_compat import pmap
from support.compare import assert_trees_equal, compare_with_legacy
from support.jax_lines import has
from support.legacy_pmap import legacy_reference

TOL = dict(rtol=1e-5, atol=1e-6)


def arr(*shape):
  return (np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + 1) / 10


def body(x):
  return jnp.sin(x) * lax.psum(x, "i") + lax.axis_index("i")


AROUND = {
    "jit": lambda f: jax.jit(f)(arr(8, 3)),
    "jit_twice": lambda f: (jax.jit(f)(arr(8, 3)), jax.jit(f)(arr(8, 3) * 2)),
    "vmap": lambda f: jax.vmap(f)(arr(2, 8, 3)),
    "vmap_axis1": lambda f: jax.vmap(f, in_axes=1, out_axes=2)(arr(8, 2, 3)),
    "grad": lambda f: jax.grad(lambda x: f(x).sum())(arr(8, 3)),
    "jit_grad": lambda f: jax.jit(jax.grad(lambda x: (f(x) ** 2).sum()))(arr(8, 3)),
    "value_and_grad": lambda f: jax.value_and_grad(lambda x: f(x).mean())(arr(8, 3)),
    "jvp": lambda f: jax.jvp(f, (arr(8, 3),), (arr(8, 3) * 0.5,)),
    "linearize": lambda f: jax.linearize(f, arr(8, 3))[1](arr(8, 3) * 2),
    "vjp": lambda f: jax.vjp(f, arr(8, 3))[1](arr(8, 3)),
    "checkpoint": lambda f: jax.grad(lambda x: jax.checkpoint(f)(x).sum())(arr(8, 3)),
    "hessian": lambda f: jax.hessian(lambda x: f(x).sum())(arr(8, 2)),
    "scan": lambda f: lax.scan(lambda c, _: (f(c), c.sum()), arr(8, 3), None, length=3),
    "cond": lambda f: lax.cond(True, f, lambda x: x, arr(8, 3)),
    "while": lambda f: lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, f(c[1]) / 10),
                                      (0, arr(8, 3))),
    "fori_grad": lambda f: jax.grad(lambda x: lax.fori_loop(0, 2, lambda i, c: f(c), x).sum())(
        arr(8, 3)),
}


@pytest.mark.parametrize("name", sorted(AROUND))
def test_transformation_around_pmap(name):
  compare_with_legacy(lambda pm: AROUND[name](pm(body, "i")), pmap, **TOL)


@jax.custom_vjp
def clip_grad(x):
  return x


def _fwd(x):
  return x, None


def _bwd(_, g):
  return (jnp.clip(g, -0.5, 0.5),)


clip_grad.defvjp(_fwd, _bwd)

INSIDE = {
    "vmap": lambda x: jax.vmap(lambda r: r * lax.psum(r, "i"))(x),
    "vmap_named": lambda x: jax.vmap(lambda r: lax.psum(r, ("i", "b")), axis_name="b")(x),
    "grad": lambda x: jax.grad(lambda v: (jnp.sin(v) * lax.pmean(v, "i")).sum())(x),
    "checkpoint": lambda x: jax.checkpoint(lambda v: jnp.exp(v) + lax.psum(v, "i"))(x),
    "custom_vjp": lambda x: jax.grad(lambda v: (clip_grad(v) * 3 * v).sum())(x),
    "scan": lambda x: lax.scan(lambda c, r: (c + lax.psum(r, "i"), c * r), jnp.zeros(()), x),
    "cond": lambda x: lax.cond(lax.psum(x.sum(), "i") > 1, lambda v: lax.psum(v, "i"), jnp.cos, x),
    "cond_varying": lambda x: lax.cond(x.sum() > 1, jnp.sin, jnp.cos, x),
    "switch_index": lambda x: lax.switch(lax.axis_index("i") % 3, [jnp.sin, jnp.cos, jnp.tan], x),
    "while": lambda x: lax.while_loop(lambda c: c[0] < 4, lambda c: (c[0] + 1, lax.pmax(c[1], "i") + c[1]),
                                      (0, x))[1],
}


@pytest.mark.parametrize("name", sorted(INSIDE))
def test_transformation_inside_pmap(name):
  compare_with_legacy(lambda pm: pm(INSIDE[name], "i")(arr(8, 3)), pmap, **TOL)


def test_float0_tangents_for_integer_inputs():
  def program(pm):
    f = pm(lambda x, n: x * n.astype(jnp.float32), "i")
    return jax.grad(lambda x, n: f(x, n).sum(), argnums=(0, 1), allow_int=True)(
        arr(8, 2), np.arange(16, dtype=np.int32).reshape(8, 2))
  compare_with_legacy(program, pmap)


def test_grad_through_out_axes_none():
  # Legacy raises NotImplementedError; the reference is the same program under vmap
  # (out_axes=None of a psum'd value = the value itself).
  def program(pm, **kw):
    f = pm(lambda x: lax.psum(x ** 2, "i"), axis_name="i", out_axes=None, **kw)
    return jax.grad(lambda x: f(x).sum())(arr(8, 3))
  if has("legacy_pmap"):  # JAX's shard_map-based jax.pmap differentiates it
    with pytest.raises(NotImplementedError):
      program(legacy_reference())
  assert_trees_equal(jax.grad(lambda x: (x ** 2).sum(0).sum())(arr(8, 3)), program(pmap), **TOL)


def test_pmap_of_different_sizes_inside_one_jit():
  # Legacy fails with an internal AssertionError; reference: the same program with vmap.
  # Where jit cannot return shard_maps of two sizes (0.9.2 on), ours fails as JAX's own
  # does; sizes mixed inside the jit work there too: test_pmap_sizes_under_jit.py.
  def program(pm):
    f8 = pm(lambda x: lax.psum(x, "i") * x, "i")
    f4 = pm(lambda x: lax.pmax(x, "i") - x, "i")
    f2 = pm(lambda x: x * lax.axis_index("i"), "i")
    return jax.jit(lambda a, b, c: (f8(a), f4(b), f2(c), f8(a).sum() + f4(b).sum()))(
        arr(8, 2), arr(4, 3), arr(2, 5))
  expected = program(lambda f, name: jax.vmap(f, axis_name=name))
  if not has("jit_returns_shard_maps_of_two_sizes"):
    with pytest.raises(ValueError):
      program(pmap)
    return
  assert_trees_equal(expected, program(pmap), **TOL)


def test_pmap_under_jit_stays_sharded():
  out = jax.jit(pmap(lambda x: x * 2, "i"))(arr(8, 3))
  assert len(out.sharding.device_set) == 8 and not out.sharding.is_fully_replicated
  compare_with_legacy(lambda pm: jax.jit(lambda x: pm(lambda v: v * 2, "i")(x) + 1)(arr(8, 3)), pmap)


def test_pmap_of_size_4_under_jit_with_our_own_4_device_output():
  # jax 0.6: our outputs are PmapSharding arrays, which jit treats as movable (not
  # committed), so they feed a size-4 pmap that spans all 8 devices under jit. jax 0.10:
  # they are committed to their 4 devices, which their aval names, so the pmap under jit
  # keeps to those 4 devices.
  f = pmap(lambda x: x + 1, "i")
  x4 = f(arr(4, 2))
  compare_with_legacy(lambda pm: jax.jit(pm(lambda x: x * 3, "i"))(
      x4 if pm is pmap else jax.pmap(lambda v: v + 1)(arr(4, 2))), pmap)
