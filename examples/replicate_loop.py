"""A Flax-style training loop in plain JAX: replicate, shard, step, unreplicate.

This is the shape of countless pmap training scripts (Flax's `jax_utils`
helpers written out): the initial state is copied to every local device with
`jax.device_put_replicated`, each host batch is reshaped to
`(local_device_count, -1, ...)`, the step is pmapped with donated state, and
`tree_map(lambda x: x[0], ...)` brings one copy back for evaluation and
checkpointing.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def replicate(tree):
  return jax.device_put_replicated(tree, jax.local_devices())


def unreplicate(tree):
  return jax.tree.map(lambda x: x[0], tree)


def shard(batch):
  n = jax.local_device_count()
  return jax.tree.map(lambda x: x.reshape((n, -1) + x.shape[1:]), batch)


def init_state(features: int, seed: int = 11) -> dict:
  rng = np.random.default_rng(seed)
  params = {"w": (rng.normal(size=(features, 2)) * 0.1).astype(np.float32),
            "b": np.zeros((2,), np.float32)}
  return {"step": np.int32(0), "params": params,
          "velocity": jax.tree.map(np.zeros_like, params)}


def logistic_loss(params, x, y):
  logits = x @ params["w"] + params["b"]
  return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * jax.nn.one_hot(y, 2), -1))


@functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0,))
def train_step(state, batch):
  loss, grads = jax.value_and_grad(logistic_loss)(state["params"], batch["x"], batch["y"])
  grads = jax.lax.pmean(grads, "batch")
  velocity = jax.tree.map(lambda v, g: 0.8 * v + g, state["velocity"], grads)
  params = jax.tree.map(lambda p, v: p - 0.2 * v, state["params"], velocity)
  new_state = {"step": state["step"] + 1, "params": params, "velocity": velocity}
  return new_state, jax.lax.pmean(loss, "batch")


@jax.jit
def accuracy(params, x, y):
  return jnp.mean(jnp.argmax(x @ params["w"] + params["b"], -1) == y)


def run(epochs: int = 2, batches_per_epoch: int = 3) -> dict:
  n = jax.local_device_count()
  rng = np.random.default_rng(12)
  features = 5
  x_all = rng.normal(size=(epochs * batches_per_epoch, 4 * n, features)).astype(np.float32)
  y_all = (x_all[..., 0] + 0.5 * x_all[..., 1] > 0).astype(np.int32)
  state = replicate(init_state(features))
  losses, accuracies = [], []
  for epoch in range(epochs):
    for b in range(batches_per_epoch):
      i = epoch * batches_per_epoch + b
      state, loss = train_step(state, shard({"x": x_all[i], "y": y_all[i]}))
      losses.append(loss[0])
    host_state = unreplicate(state)
    accuracies.append(accuracy(host_state["params"], x_all[0], y_all[0]))
  return {"state": unreplicate(state), "replicated_state": state,
          "losses": jnp.stack(losses), "accuracy": jnp.stack(accuracies)}


if __name__ == "__main__":
  out = run()
  print("steps:", int(out["state"]["step"]))
  print("loss:", np.asarray(out["losses"]))
  print("accuracy per epoch:", np.asarray(out["accuracy"]))
