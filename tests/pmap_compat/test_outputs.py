"""Row 21: what comes out of pmap_compat.pmap and how it behaves downstream.

Our results are ``PmapSharding`` arrays over the same per-device buffers the compiled
shard_map program wrote, like legacy's: ``out[0]`` / unreplicate read one device's
buffer (no communication: checked with ``jax.transfer_guard("disallow")``), results
feed the next call as they are, and every downstream use gives legacy's values.
"""
import pytest

from support.jax_lines import has

if not has("pmap_sharding"):
  pytest.skip("PmapSharding results exist only where JAX has PmapSharding; without it the "
              "results are checked in test_outputs_jax010.py", allow_module_level=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax._src.sharding_impls import PmapSharding  # noqa: E402  (jax.sharding's warns on 0.8-0.9)

from pmap_compat import pmap  # noqa: E402
from support.compare import assert_trees_equal, compare_with_legacy  # noqa: E402
from support.legacy_pmap import legacy_pmap  # noqa: E402

N = 8


def data(*shape):
  return (np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) % 7) - 2.5


def step(x):
  return lax.psum(x, "i") * 0.5 + x * lax.axis_index("i")


def both(fun, *args, **kwargs):
  """(legacy result, our result) of the same call."""
  kwargs.setdefault("axis_name", "i")
  return legacy_pmap(fun, **kwargs)(*args), pmap(fun, **kwargs)(*args)


@pytest.mark.parametrize("in_axes,out_axes,shape", [
    (0, 0, (N, 3)), (1, 1, (2, N, 3)), (0, 1, (N, 2)), (2, 0, (2, 3, N)), (0, None, (N, 2))])
def test_output_sharding_equals_legacy(in_axes, out_axes, shape):
  fun = (lambda x: lax.pmean(x, "i")) if out_axes is None else step
  legacy, ours = both(fun, data(*shape), in_axes=in_axes, out_axes=out_axes)
  assert isinstance(ours.sharding, PmapSharding)
  assert ours.sharding == legacy.sharding
  assert ours.committed == legacy.committed
  assert [s.device for s in ours.addressable_shards] == [s.device for s in legacy.addressable_shards]
  assert [s.index for s in ours.addressable_shards] == [s.index for s in legacy.addressable_shards]
  assert_trees_equal(legacy, ours)


def test_pytree_outputs_are_all_pmap_sharded():
  legacy, ours = both(lambda t: {"a": step(t[0]), "b": [t[1] + 1, lax.psum(t[1], "i")]},
                      (data(N, 2), data(N)))
  for l, o in zip(jax.tree.leaves(legacy), jax.tree.leaves(ours), strict=True):
    assert o.sharding == l.sharding
  assert_trees_equal(legacy, ours)


@pytest.mark.parametrize("index", [0, 3, -1, (2, 1), slice(None), slice(1, 5), Ellipsis])
def test_indexing_matches_legacy(index):
  legacy, ours = both(step, data(N, 4))
  assert_trees_equal(legacy[index], ours[index])


def test_first_row_reads_one_buffer_without_communication():
  legacy, ours = both(step, data(N, 4, 2))
  with jax.transfer_guard("disallow"):
    row = ours[0]
    leg_row = legacy[0]
  assert row.sharding == leg_row.sharding  # a single-device array on device 0
  assert_trees_equal(leg_row, row)


def test_flax_style_unreplicate():
  def train_state(pm):
    f = pm(lambda p: jax.tree.map(lambda a: lax.pmean(a * 2, "i"), p), axis_name="i")
    params = {"w": data(N, 3, 3), "b": data(N, 3), "step": np.arange(N, dtype=np.int32)}
    return f(params)
  legacy, ours = train_state(legacy_pmap), train_state(pmap)
  with jax.transfer_guard("disallow"):
    unrep = jax.tree.map(lambda x: x[0], ours)
  assert_trees_equal(jax.tree.map(lambda x: x[0], legacy), unrep)


def test_host_values_and_reductions_match_legacy():
  def program(pm):
    y = pm(step, axis_name="i")(data(N, 5))
    return (np.asarray(y), jnp.sum(y), y.sum(axis=0), jnp.mean(y, axis=1), y.max(),
            float(y[2, 3]), y.tolist() == np.asarray(y).tolist(), [np.asarray(r) for r in y])
  compare_with_legacy(program, pmap)


def test_jit_over_outputs_matches_legacy_on_every_call():
  def program(pm):
    f = pm(step, axis_name="i")
    reduce = jax.jit(lambda a, b: (a * b).sum(axis=0) + a[1])
    results = []
    y = f(data(N, 3))
    for _ in range(3):  # the first call compiles; later calls take jit's C++ path
      results.append(reduce(y, y))
      y = f(y)
    return results
  compare_with_legacy(program, pmap)


def test_outputs_chain_into_the_next_call_without_moving_data():
  f, ref = pmap(step, "i"), legacy_pmap(step, "i")
  y, expected = f(data(N, 3)), ref(data(N, 3))
  y = f(y)  # slow path once for this signature
  expected = ref(expected)
  with jax.transfer_guard("disallow"):
    for _ in range(3):
      y, expected = f(y), ref(expected)
  assert_trees_equal(expected, y)


def test_outputs_feed_legacy_pmap_and_legacy_outputs_feed_ours():
  f, ref = pmap(step, "i"), legacy_pmap(step, "i")
  ours, legacy = f(data(N, 2)), ref(data(N, 2))
  ref(ours), f(legacy)  # compile outside the guard
  with jax.transfer_guard("disallow"):
    mixed = (ref(ours), f(legacy))
  assert_trees_equal((ref(legacy), ref(legacy)), mixed)


def test_donated_output_is_consumed_in_place():
  f = pmap(lambda x: x * 2 + 1, donate_argnums=0)
  ref = legacy_pmap(lambda x: x * 2 + 1, donate_argnums=0)
  y, expected = f(data(N, 16)), ref(data(N, 16))
  y, expected = f(y), ref(expected)  # settle the signature on our own outputs
  before = [s.data.unsafe_buffer_pointer() for s in y.addressable_shards]
  out = f(y)
  assert y.is_deleted()
  leg_in = expected
  expected = ref(expected)
  assert leg_in.is_deleted()
  assert [s.data.unsafe_buffer_pointer() for s in out.addressable_shards] == before
  assert_trees_equal(expected, out)


def test_typed_key_outputs():
  def program(pm):
    keys = pm(lambda k: jax.random.split(k, 3)[1], axis_name="i")(
        jax.random.split(jax.random.key(0), N))
    return keys, keys[0], jax.random.key_data(keys), jax.random.uniform(keys[2])
  compare_with_legacy(program, pmap)


def test_out_axes_none_result_behaves_like_legacy():
  def program(pm):
    y = pm(lambda x: lax.psum(x, "i"), axis_name="i", out_axes=None)(data(N, 3))
    return y, y[1], np.asarray(y), jax.jit(lambda a: a * 2)(y), y.sharding.is_fully_replicated
  compare_with_legacy(program, pmap)
