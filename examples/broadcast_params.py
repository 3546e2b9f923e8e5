"""Sharded evaluation with broadcast parameters: `in_axes=(0, None)`.

The batch is split across devices while the parameters are passed once,
unreplicated, and broadcast to every device by pmap itself (`in_axes=None` for
the whole params pytree). Per-device predictions come back stacked; the
accuracy is summed across devices with psum.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def mlp(params, x):
  for layer in params["layers"][:-1]:
    x = jax.nn.relu(x @ layer["w"] + layer["b"])
  last = params["layers"][-1]
  return x @ last["w"] + last["b"]


def evaluate(x, params):
  images, labels = x
  logits = mlp(params, images)
  predictions = jnp.argmax(logits, axis=-1)
  correct = jax.lax.psum(jnp.sum(predictions == labels), axis_name="eval")
  return predictions, jax.nn.log_softmax(logits), correct


def init_params(sizes, seed: int = 3) -> dict:
  rng = np.random.default_rng(seed)
  layers = [{"w": (rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32),
             "b": np.zeros((b,), np.float32)} for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
  return {"layers": layers}


def run(batches: int = 2) -> dict:
  n_dev = jax.local_device_count()
  params = init_params((12, 16, 10))
  eval_step = jax.pmap(evaluate, axis_name="eval", in_axes=(0, None))
  rng = np.random.default_rng(4)
  outputs = []
  for _ in range(batches):
    images = rng.normal(size=(n_dev, 4, 12)).astype(np.float32)
    labels = rng.integers(0, 10, size=(n_dev, 4)).astype(np.int32)
    outputs.append(eval_step((images, labels), params))
  preds, log_probs, correct = (jnp.stack(v) for v in zip(*outputs, strict=True))
  return {"predictions": preds, "log_probs": log_probs, "correct": correct}


if __name__ == "__main__":
  out = run()
  total = out["predictions"][0].size
  print("correct per batch:", [int(c[0]) for c in out["correct"]], "of", total)
  print("predictions shape:", out["predictions"].shape)
