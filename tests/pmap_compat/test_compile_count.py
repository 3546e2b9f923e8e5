"""One compile per step function and input signature: a Flax-style loop (replicate ->
step -> step) compiles its step once with pmap_compat, called directly or through
``patched()``, whether the first step's state comes from ``device_put_replicated`` or
from host values, and gives the reference pmap's bits (legacy where it exists, else the
release's own ``jax.pmap``, which compiles such a loop's step twice on jax 0.10)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pmap_compat
from line_helpers import device_put_replicated as legacy_replicated
from support.compare import assert_trees_equal
from support.compiles import compiles, step_compiles
from support.legacy_pmap import has_legacy_pmap, reference_pmap

N = jax.local_device_count()


def train_step(state, batch):
  def loss_fn(params):
    logits = batch["x"] @ params["w"] + params["b"]
    return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(batch["y"], 2), -1))
  loss, grads = jax.value_and_grad(loss_fn)(state["params"])
  grads = jax.lax.pmean(grads, "batch")
  params = jax.tree.map(lambda p, g: p - 0.1 * g, state["params"], grads)
  return {"step": state["step"] + 1, "params": params}, jax.lax.pmean(loss, "batch")


def init_state():
  rng = np.random.default_rng(3)
  return {"step": np.int32(0),
          "params": {"w": rng.normal(size=(5, 2)).astype(np.float32) * 0.1,
                     "b": np.zeros((2,), np.float32)}}


def batches(steps=3):
  rng = np.random.default_rng(4)
  x = rng.normal(size=(steps, N, 4, 5)).astype(np.float32)
  return [{"x": x[i], "y": (x[i, ..., 0] > 0).astype(np.int32)} for i in range(steps)]


def _patched_replicated(tree, devices):
  """``jax.device_put_replicated`` as code run under ``patched()`` finds it (jax 0.10
  dropped it from ``jax``; ``patched()`` provides JAX's own implementation)."""
  with pmap_compat.patched():
    return jax.device_put_replicated(tree, devices)


REPLICATE = {
    "device_put_replicated": lambda tree: legacy_replicated(tree, jax.local_devices()),
    "patched_device_put_replicated": lambda tree: _patched_replicated(tree, jax.local_devices()),
    "numpy_stack": lambda tree: jax.tree.map(lambda v: np.stack([v] * N), tree),
    "jnp_stack": lambda tree: jax.tree.map(lambda v: jnp.stack([jnp.asarray(v)] * N), tree),
}


def loop(pmap, replicate):
  step = pmap(train_step, axis_name="batch", donate_argnums=(0,))
  state = replicate(init_state())
  losses = []
  for batch in batches():
    state, loss = step(state, batch)
    losses.append(loss)
  return jax.device_get((state, losses))


def direct(replicate):
  return loop(pmap_compat.pmap, replicate)


def through_patched(replicate):
  with pmap_compat.patched():
    return loop(lambda *a, **k: jax.pmap(*a, **k), replicate)


MODES = {"direct": direct, "patched": through_patched}


def _cases():
  for mode in sorted(MODES):
    for kind in sorted(REPLICATE):
      yield pytest.param(mode, kind, id=f"{mode}-{kind}")


@pytest.mark.parametrize("mode,kind", list(_cases()))
def test_replicate_step_step_compiles_the_step_once(mode, kind):
  jax.clear_caches()
  with compiles() as counts:
    MODES[mode](REPLICATE[kind])
  assert step_compiles(counts, "train_step") == 1, dict(counts)


@pytest.mark.parametrize("mode,kind", [(m, k) for m in sorted(MODES) for k in sorted(REPLICATE)])
def test_replicate_step_step_gives_the_reference_bits(mode, kind):
  _, reference = reference_pmap()
  expected = loop(reference, REPLICATE[kind])
  assert_trees_equal(expected, MODES[mode](REPLICATE[kind]))


@pytest.mark.skipif(not has_legacy_pmap(), reason="legacy pmap's own count is the reference")
@pytest.mark.parametrize("kind", sorted(REPLICATE))
def test_as_many_compiles_as_legacy(kind):
  _, reference = reference_pmap()
  jax.clear_caches()
  with compiles() as legacy_counts:
    loop(reference, REPLICATE[kind])
  jax.clear_caches()
  with compiles() as counts:
    direct(REPLICATE[kind])
  assert step_compiles(counts, "train_step") == step_compiles(legacy_counts, "train_step")


def test_a_longer_loop_without_donation_compiles_once():
  """Without donation the replicated state stays alive; four steps still share one
  executable."""
  step = pmap_compat.pmap(train_step, axis_name="batch")
  state = REPLICATE["device_put_replicated"](init_state())
  jax.clear_caches()
  with compiles() as counts:
    for batch in batches(4):
      state, _ = step(state, batch)
  assert step_compiles(counts, "train_step") == 1, dict(counts)
