"""Data-parallel SGD written with Flax NNX's own `nnx.pmap` (flax/nnx/transforms/iteration.py).

`nnx.pmap` is library code that maps the user's function: it calls `jax.pmap` with its own
`axis_name=None` default, `in_axes`/`out_axes` trees built at run time and its
`global_arg_shapes` parameter passed through. Here it maps a train step over the batch
(`axis_name="batch"`, gradients averaged with `pmean`) with the model broadcast
(`in_axes=(None, 0, 0)`), and an evaluation with every default (`axis_name=None`).
Tiny MLP, synthetic data, fixed seed.
"""
from __future__ import annotations

import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


class MLP(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.hidden = nnx.Linear(6, 16, rngs=rngs)
    self.out = nnx.Linear(16, 2, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.out(jax.nn.relu(self.hidden(x)))


def train_step(model: MLP, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Any]:
  def loss_fn(m: MLP) -> jax.Array:
    return jnp.mean((m(x) - y) ** 2)
  loss, grads = nnx.value_and_grad(loss_fn)(model)
  return jax.lax.pmean(loss, "batch"), jax.lax.pmean(grads, "batch")


def evaluate(model: MLP, x: jax.Array) -> jax.Array:
  return model(x)


def run(steps: int = 3) -> dict[str, Any]:
  """A few SGD steps over 8 device shards; returns the parameters, losses and predictions."""
  n = jax.local_device_count()
  rng = np.random.default_rng(3)
  x = rng.normal(size=(n, 4, 6)).astype(np.float32)
  y = rng.normal(size=(n, 4, 2)).astype(np.float32)
  model = MLP(nnx.Rngs(0))
  step = nnx.pmap(train_step, axis_name="batch", in_axes=(None, 0, 0), out_axes=0)
  predict = nnx.pmap(evaluate, in_axes=(None, 0), out_axes=0)
  losses = []
  for _ in range(steps):
    loss, grads = step(model, x, y)
    # Every shard holds the same averaged gradients: update with shard 0's, as users do.
    params = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda p, g: p - 0.1 * g[0], params, grads))
    losses.append(loss)
  return jax.tree.map(np.asarray, {
      "params": nnx.to_pure_dict(nnx.state(model, nnx.Param)),
      "losses": jnp.stack(losses), "predictions": predict(model, x)})


if __name__ == "__main__":
  if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    sys.exit("set XLA_FLAGS=--xla_force_host_platform_device_count=8 before running")
  print(run()["losses"][:, 0])
