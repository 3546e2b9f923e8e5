"""Sharded optimizer state (ZeRO-style) with all_gather and psum_scatter.

Each device stores only its 1/n slice of the parameters and of the momentum.
A step all-gathers the full parameters, computes gradients on the local batch,
then psum_scatters the gradients so every device receives the sum of its own
slice only, and updates that slice. Nothing is ever fully replicated.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def loss_fn(w, x, y):
  return jnp.mean((jnp.tanh(x @ w) - y) ** 2)


@functools.partial(jax.pmap, axis_name="shards", donate_argnums=(0, 1))
def zero_step(w_slice, momentum_slice, x, y):
  w = jax.lax.all_gather(w_slice, "shards", tiled=True)  # (n * k, out)
  loss, grad = jax.value_and_grad(loss_fn)(w, x, y)
  grad_slice = jax.lax.psum_scatter(grad, "shards", scatter_dimension=0, tiled=True)
  n = jax.lax.psum(1, "shards")
  momentum_slice = 0.9 * momentum_slice + grad_slice / n
  w_slice = w_slice - 0.1 * momentum_slice
  untiled = jax.lax.all_gather(loss, "shards")  # one entry per device
  return w_slice, momentum_slice, untiled


def run(steps: int = 4) -> dict:
  n = jax.local_device_count()
  rng = np.random.default_rng(9)
  features, outputs = 2 * n, 3
  w = (rng.normal(size=(features, outputs)) * 0.3).astype(np.float32)
  w_slices = w.reshape(n, features // n, outputs)
  momentum = np.zeros_like(w_slices)
  x = rng.normal(size=(n, 6, features)).astype(np.float32)
  y = rng.normal(size=(n, 6, outputs)).astype(np.float32)
  losses = []
  for _ in range(steps):
    w_slices, momentum, per_device_loss = zero_step(w_slices, momentum, x, y)
    losses.append(per_device_loss)
  return {"w_slices": w_slices, "momentum": momentum, "losses": jnp.stack(losses)}


if __name__ == "__main__":
  out = run()
  print("mean loss per step:", np.asarray(out["losses"])[:, 0].mean(axis=-1))
  print("parameter slice shape per device:", out["w_slices"].shape[1:])
