"""Nested pmap: data parallelism over `data`, tensor parallelism over `model`.

The outer pmap maps batch shards over the `data` axis; the inner pmap maps the
two halves of a row-parallel layer over the `model` axis. Each model shard
computes a partial product that is psum'd over `model`; gradients are averaged
over `data` only (each model shard keeps its own slice); the global example
count is a psum over both axes at once, and the device coordinates come from
axis_index on each axis.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

MODEL = 2  # tensor-parallel width; the data axis takes the remaining devices


def layer_loss(w_shard, x_shard, y):
  partial_out = x_shard @ w_shard
  out = jax.lax.psum(partial_out, "model")  # row-parallel: sum the partial products
  return jnp.mean((out - y) ** 2)


def sharded_step(w_shard, x_shard, y):
  loss, grad = jax.value_and_grad(layer_loss)(w_shard, x_shard, y)
  grad = jax.lax.pmean(grad, "data")
  loss = jax.lax.pmean(loss, "data")
  examples = jax.lax.psum(jnp.int32(x_shard.shape[0]), ("data", "model"))
  coords = jnp.stack([jax.lax.axis_index("data"), jax.lax.axis_index("model")])
  return w_shard - 0.05 * grad, loss, examples, coords


def run(steps: int = 3) -> dict:
  n_data = jax.local_device_count() // MODEL
  rng = np.random.default_rng(6)
  features, outputs, batch = 8, 3, 5
  # w's rows split across the model axis, replicated across the data axis.
  w = rng.normal(size=(MODEL, features // MODEL, outputs)).astype(np.float32)
  w = np.broadcast_to(w, (n_data,) + w.shape).copy()
  x = rng.normal(size=(n_data, batch, features)).astype(np.float32)
  x = x.reshape(n_data, batch, MODEL, features // MODEL).transpose(0, 2, 1, 3)
  y = rng.normal(size=(n_data, batch, outputs)).astype(np.float32)
  step = jax.pmap(jax.pmap(sharded_step, axis_name="model", in_axes=(0, 0, None)),
                  axis_name="data")
  losses = []
  for _ in range(steps):
    w, loss, examples, coords = step(w, x, y)
    losses.append(loss)
  return {"w": w, "losses": jnp.stack(losses), "examples": examples, "coords": coords}


if __name__ == "__main__":
  out = run()
  print("loss per step:", np.asarray(out["losses"])[:, 0, 0])
  print("examples seen per step:", int(out["examples"][0, 0]))
  print("device coordinates (data, model):", np.asarray(out["coords"]).reshape(-1, 2).tolist())
