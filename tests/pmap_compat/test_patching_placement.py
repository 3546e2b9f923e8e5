"""``pmap_compat.patched()`` and the placement functions pmap code pairs with ``jax.pmap``.

Flax-style helpers replicate state with ``jax.device_put_replicated`` and shard stacks
with ``jax.device_put_sharded``. jax 0.10.0 dropped both from the ``jax`` namespace, so
such code stopped before its first pmap even when ``jax.pmap`` was ours. While patched
they exist again (JAX's own implementations, kept in ``jax._src.api``); where JAX still
has them, patched() leaves them alone.
"""
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pmap_compat
from support.compare import compare_with_legacy
from support.jax_lines import has, requires

PLACEMENT = ("device_put_replicated", "device_put_sharded")
ORIGINAL = {name: vars(jax).get(name) for name in PLACEMENT}


def _flax_style_loop(pmap):
  """Replicate, shard, two pmapped SGD steps with donation, unreplicate."""
  devices = jax.local_devices()
  n = len(devices)
  rng = np.random.RandomState(3)
  params = {"w": rng.randn(3, 2).astype(np.float32), "b": np.zeros((2,), np.float32)}
  shards = [{"x": rng.randn(4, 3).astype(np.float32), "y": rng.randn(4, 2).astype(np.float32)}
            for _ in range(n)]

  def step(p, batch):
    def loss(q):
      return jnp.mean((batch["x"] @ q["w"] + q["b"] - batch["y"]) ** 2)
    l, g = jax.value_and_grad(loss)(p)
    g = jax.lax.pmean(g, "batch")
    return jax.tree.map(lambda a, d: a - 0.1 * d, p, g), jax.lax.pmean(l, "batch")

  train = pmap(step, axis_name="batch", donate_argnums=(0,))
  state = jax.device_put_replicated(params, devices)
  batch = jax.device_put_sharded(shards, devices)
  losses = []
  for _ in range(2):
    state, loss = train(state, batch)
    losses.append(loss[0])
  return jax.tree.map(lambda x: x[0], state), losses, batch


def _patched_where_removed():
  # Where JAX has them the legacy run must see its own: nothing is patched there, and the
  # placement functions are JAX's own either way.
  return contextlib.nullcontext() if has("placement_functions") else pmap_compat.patched()


def test_flax_style_loop_with_placement_functions_matches_legacy():
  with _patched_where_removed():
    compare_with_legacy(_flax_style_loop, pmap_compat.pmap)


@requires("placement_removed")
def test_patched_restores_removed_placement_functions_and_removes_them_after():
  for name in PLACEMENT:
    with pytest.raises(AttributeError, match=f"jax.{name} is deprecated"):
      getattr(jax, name)
  pmap_compat.patch()
  try:
    pmap_compat.patch()
    pmap_compat.unpatch()  # nested: still patched
    devices = jax.local_devices()
    replicated = jax.device_put_replicated(np.arange(3.0, dtype=np.float32), devices)
    stacked = jax.device_put_sharded([np.full((2,), i, np.int32) for i in range(len(devices))],
                                     devices)
    # Each device holds its own (1, ...) block, as legacy placed them.
    for value, expected in ((replicated, lambda i: np.arange(3.0, dtype=np.float32)[None]),
                            (stacked, lambda i: np.full((1, 2), i, np.int32))):
      assert [s.device for s in value.addressable_shards] == devices
      for i, shard in enumerate(value.addressable_shards):
        np.testing.assert_array_equal(np.asarray(shard.data), expected(i))
  finally:
    pmap_compat.unpatch()
  for name in PLACEMENT:
    assert name not in vars(jax)
    with pytest.raises(AttributeError, match=f"jax.{name} is deprecated"):
      getattr(jax, name)


@requires("placement_removed")
def test_placed_values_feed_pmap_compat_without_moving_data():
  """What device_put_replicated placed is what our pmap runs on, not a resharded copy:
  donating it deletes it (a copy would be donated instead, leaving it alive)."""
  with pmap_compat.patched():
    devices = jax.local_devices()
    x = jax.device_put_replicated(np.arange(4.0, dtype=np.float32), devices)
    out = jax.pmap(lambda v: v * 2, donate_argnums=(0,))(x)
    assert x.is_deleted()
    assert [s.device for s in out.addressable_shards] == devices


@requires("placement_functions")
def test_patched_leaves_existing_placement_functions_alone():
  with pmap_compat.patched():
    for name in PLACEMENT:
      assert getattr(jax, name) is ORIGINAL[name]
  for name in PLACEMENT:
    assert getattr(jax, name) is ORIGINAL[name]
