"""``pmap_compat.patched()`` / ``patch()`` / ``unpatch()``: third-party code calling jax.pmap."""
import textwrap
import types

import jax
import numpy as np
import pytest

import pmap_compat
from support.compare import assert_trees_equal
import line_helpers

LEGACY = jax.pmap

# A Flax-`jax_utils`-style module: it does `import jax` at import time and calls
# `jax.pmap` at call time, like flax.jax_utils.replicate / unreplicate / pmean.
JAX_UTILS = textwrap.dedent("""
    import jax
    import jax.numpy as jnp

    def replicate(tree, devices=None):
      devices = devices or jax.local_devices()
      return line_helpers.device_put_replicated(tree, devices)

    def unreplicate(tree):
      return jax.tree_util.tree_map(lambda x: x[0], tree)

    def pmean(tree, axis_name="batch"):
      return jax.lax.pmean(tree, axis_name)

    def make_train_step(lr):
      def step(params, batch):
        def loss(p):
          return jnp.mean((batch["x"] @ p["w"] + p["b"] - batch["y"]) ** 2)
        l, g = jax.value_and_grad(loss)(params)
        g = pmean(g)
        return jax.tree_util.tree_map(lambda p, d: p - lr * d, params, g), jax.lax.pmean(l, "batch")
      return jax.pmap(step, axis_name="batch")

    def pmap_via_from_import():
      from jax import pmap
      return pmap
""")


def _load_utils():
  module = types.ModuleType("fake_jax_utils")
  module.line_helpers = line_helpers  # device_put_replicated, which jax 0.10 removed
  exec(compile(JAX_UTILS, "fake_jax_utils.py", "exec"), module.__dict__)  # noqa: S102
  return module


def _train(utils, steps=3):
  rng = np.random.RandomState(0)
  params = {"w": rng.randn(3, 1).astype(np.float32), "b": np.zeros((1,), np.float32)}
  batch = {"x": rng.randn(8, 4, 3).astype(np.float32), "y": rng.randn(8, 4, 1).astype(np.float32)}
  step = utils.make_train_step(0.1)
  p = utils.replicate(params)
  losses = []
  for _ in range(steps):
    p, loss = step(p, batch)
    losses.append(loss)
  return utils.unreplicate(p), [utils.unreplicate(l) for l in losses], step


def test_patched_context_makes_jax_pmap_ours_and_restores():
  utils = _load_utils()
  legacy_params, legacy_losses, legacy_step = _train(utils)
  with pmap_compat.patched():
    assert jax.pmap is pmap_compat.pmap
    ours_params, ours_losses, ours_step = _train(utils)
    assert utils.pmap_via_from_import() is pmap_compat.pmap
  assert jax.pmap is LEGACY
  assert getattr(ours_step, "_pmap_config", None) is not None      # really built by us
  assert getattr(legacy_step, "_pmap_config", None) is None
  assert_trees_equal((legacy_params, legacy_losses), (ours_params, ours_losses), rtol=1e-6)


def test_patch_unpatch_nest_and_unbalanced_unpatch_raises():
  pmap_compat.patch()
  try:
    pmap_compat.patch()
    assert jax.pmap is pmap_compat.pmap
    pmap_compat.unpatch()
    assert jax.pmap is pmap_compat.pmap
  finally:
    pmap_compat.unpatch()
  assert jax.pmap is LEGACY
  with pytest.raises(RuntimeError, match="without a matching patch"):
    pmap_compat.unpatch()


def test_patched_restores_on_exception():
  with pytest.raises(KeyError):
    with pmap_compat.patched():
      raise KeyError("x")
  assert jax.pmap is LEGACY
