"""in_axes / out_axes in every form, kwargs, the rank-reducing map, out_axes=None (rows 1-5, 31)."""
import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pmap_compat import pmap
from support.compare import assert_trees_equal, compare_call

Pair = collections.namedtuple("Pair", "a b")


@jax.tree_util.register_pytree_node_class
class Box:
  """A custom pytree with aux data."""

  def __init__(self, value, tag="box"):
    self.value, self.tag = value, tag

  def tree_flatten(self):
    return (self.value,), self.tag

  @classmethod
  def tree_unflatten(cls, tag, children):
    return cls(children[0], tag)


def arr(*shape, dtype=np.float32, start=0):
  return (np.arange(int(np.prod(shape)), dtype=dtype) + start).reshape(shape)


@pytest.mark.parametrize("in_axes,shape", [(0, (8, 3)), (1, (3, 8)), (2, (2, 3, 8)), (1, (2, 8, 3))])
def test_int_in_axes_remove_the_mapped_axis(in_axes, shape):
  compare_call(lambda x: (x * 2, jnp.sum(x, axis=0)), (arr(*shape),),
               pmap, in_axes=in_axes)


def test_rank_inside_fun_is_reduced():
  seen = {}

  def f(x, y):
    seen[len(seen)] = (x.shape, y.shape)
    return x.sum() + y.sum()
  compare_call(f, (arr(3, 8, 2), arr(8, 5)), pmap, in_axes=(1, 0))
  # On jax 0.6 legacy traced first, then ours: both saw the same per-device shapes (on
  # jax 0.10 only ours ran).
  assert seen and all(shapes == ((3, 2), (5,)) for shapes in seen.values()), seen


@pytest.mark.parametrize("out_axes", [0, 1, 2, (1, 0), (None, 2)])
def test_out_axes_positions(out_axes):
  compare_call(lambda x: (x * 3, x.T + 1), (arr(8, 2, 3),), pmap, out_axes=out_axes)


def test_in_axes_none_broadcasts_and_pytree_prefix():
  compare_call(lambda x, y, z: x * y[0] + z["k"].sum(),
               (arr(8, 2), (arr(2), arr(3)), {"k": arr(4, 8)}), pmap,
               in_axes=(0, None, {"k": 1}))


def test_in_axes_namedtuple_and_custom_pytree():
  compare_call(lambda p, b: (p.a + p.b.sum(), Box(b.value * 2, "out")),
               (Pair(arr(8, 2), arr(3, 8)), Box(arr(8, 4))), pmap,
               in_axes=(Pair(0, 1), Box(0)))


def test_out_axes_pytree_prefix_namedtuple():
  compare_call(lambda x: Pair(x + 1, {"u": x * 2, "v": x.sum()}), (arr(8, 3),), pmap,
               out_axes=Pair(1, {"u": 0, "v": None}))


def test_kwargs_are_mapped_on_axis_zero():
  compare_call(lambda x, y, *, z: x + y + z, (arr(8, 2), arr(2)), pmap,
               kwargs={"z": arr(8, 2, start=5)}, in_axes=(0, None))


def test_kwargs_ignore_in_axes_tuple():
  compare_call(lambda x, scale: x * scale, (arr(2, 8),), pmap, in_axes=(1,),
               kwargs={"scale": arr(8, 2)})


def test_out_axes_none_returns_replicated_value():
  compare_call(lambda x: (jax.lax.psum(x, "i"), x), (arr(8, 3),), pmap, axis_name="i",
               out_axes=(None, 0))


def test_out_axes_none_on_varying_value_matches_legacy_device_zero():
  compare_call(lambda x: x * 2, (arr(8, 3),), pmap, out_axes=None)


def test_check_replicated_raises_on_varying_output():
  f = pmap(lambda x: (x * 2, jax.lax.pmean(x, "i")), "i", out_axes=None, check_replicated=True)
  with pytest.raises(ValueError, match=r"out_axes=None.*\[0\]"):
    f(arr(8, 3))


def test_check_replicated_passes_invariant_output_and_agrees_with_legacy():
  x = arr(8, 3)
  ours = pmap(lambda v: jax.lax.psum(v, "i"), "i", out_axes=None, check_replicated=True)(x)
  legacy = jax.pmap(lambda v: jax.lax.psum(v, "i"), "i", out_axes=None)(x)
  assert_trees_equal(legacy, ours)


def test_check_replicated_bitwise_and_nan_safe():
  f = pmap(lambda v: jnp.full((2,), jnp.nan) + 0 * jax.lax.psum(v, "i").sum(), "i",
           out_axes=None, check_replicated=True)
  np.testing.assert_array_equal(np.isnan(f(arr(8))), [True, True])


def test_mapped_axis_smaller_than_device_count_uses_first_devices():
  legacy = compare_call(lambda x: jax.lax.psum(x, "i") + x, (arr(3, 2),), pmap, axis_name="i")
  out = pmap(lambda x: x, "i")(arr(3, 2))
  assert {d.id for d in out.devices()} == {0, 1, 2}
  assert legacy.error is None


def _scaled(x, y):
  return x * 2 + jax.lax.axis_index("i") * y


def _outer(x, y):
  return jnp.outer(x, x) * y


@pytest.mark.parametrize("fun,in_axes,out_axes,shape", [
    (_scaled, (-1, None), 0, (3, 8)), (_scaled, (0, None), -1, (8, 3)),
    (_scaled, (-2, None), -2, (2, 8, 3)), (_outer, (-1, None), -3, (4, 8))])
def test_negative_axes_are_normalised_like_vmap(fun, in_axes, out_axes, shape):
  # Legacy pmap fails on negative axes (internal AssertionError), so the reference is the
  # same program under vmap, which defines negative axes (see pmap_differences.md).
  args = (arr(*shape), np.float32(3))
  ours = pmap(fun, "i", in_axes=in_axes, out_axes=out_axes)(*args)
  expected = jax.vmap(fun, in_axes=in_axes, out_axes=out_axes, axis_name="i")(*args)
  assert_trees_equal(expected, ours)


def test_negative_in_axes_past_rank_raises_legacy_rank_error():
  with pytest.raises(ValueError, match="rank should be at least 3"):
    pmap(lambda x: x, in_axes=-3)(arr(8, 2))


def test_list_in_axes_behaves_like_legacy():
  compare_call(lambda x, y: x + y, (arr(8), arr(8)), pmap, in_axes=[0, 0])


def test_scalar_and_numpy_inputs_with_in_axes_none():
  compare_call(lambda x, s, t: x * s + t, (arr(8, 2), 3.0, np.int32(2)), pmap,
               in_axes=(0, None, None))


def test_output_structures_match():
  compare_call(lambda x: {"a": [x, (x + 1,)], "b": None, "c": ()}, (arr(8, 2),), pmap)


def test_integer_and_bool_dtypes():
  compare_call(lambda x, b: (x // 2, ~b, x.astype(jnp.int8)),
               (arr(8, 3, dtype=np.int32), np.arange(8) % 2 == 0), pmap)


@pytest.mark.parametrize("dtype", [np.complex64, jnp.bfloat16, np.int8, np.bool_])
def test_check_replicated_other_dtypes(dtype):
  def f(v):
    return (v.astype(dtype), lax_psum_i(v).astype(dtype))
  strict = pmap(f, "i", out_axes=(0, None), check_replicated=True)
  assert_trees_equal(jax.pmap(f, "i", out_axes=(0, None))(arr(8, 2)), strict(arr(8, 2)))
  varying = pmap(lambda v: (v * 3).astype(dtype), "i", out_axes=None, check_replicated=True)
  with pytest.raises(ValueError, match="differ between devices"):
    varying(arr(8, 2))  # device 0 holds [0, 1], so even as bool it differs from the others


def lax_psum_i(v):
  return jax.lax.psum(v, "i")
