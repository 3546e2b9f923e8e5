"""Data-parallel SGD on a linear model: per-device gradients averaged with pmean.

Each device holds a shard of the batch and a replica of the parameters; the
gradients and the loss are averaged across devices every step, the step count
is summed with psum, and the old parameters are donated to the update.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def loss_fn(params, x, y):
  pred = x @ params["w"] + params["b"]
  return jnp.mean((pred - y) ** 2)


@functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0,))
def train_step(params, x, y):
  loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
  grads = jax.lax.pmean(grads, axis_name="batch")
  loss = jax.lax.pmean(loss, axis_name="batch")
  seen = jax.lax.psum(jnp.ones((), jnp.int32) * x.shape[0], axis_name="batch")
  new_params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
  return new_params, loss, seen


def make_data(n_dev: int, per_device: int = 16, features: int = 4, seed: int = 0):
  rng = np.random.default_rng(seed)
  true_w = rng.normal(size=(features,)).astype(np.float32)
  x = rng.normal(size=(n_dev, per_device, features)).astype(np.float32)
  y = (x @ true_w + 0.5).astype(np.float32)
  return x, y


def run(steps: int = 5) -> dict:
  n_dev = jax.local_device_count()
  x, y = make_data(n_dev)
  params = {"w": np.zeros((n_dev, x.shape[-1]), np.float32), "b": np.zeros((n_dev,), np.float32)}
  losses = []
  for _ in range(steps):
    params, loss, seen = train_step(params, x, y)
    losses.append(loss)
  return {"params": params, "losses": jnp.stack(losses), "examples_per_step": seen}


if __name__ == "__main__":
  out = run()
  print("loss per step (device 0):", np.asarray(out["losses"])[:, 0])
  print("examples per step:", int(out["examples_per_step"][0]))
  print("w (device 0):", np.asarray(out["params"]["w"][0]))
