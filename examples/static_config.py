"""A Python int configuration passed as a static argument.

`static_broadcasted_argnums=(2,)` makes `inner_steps` a compile-time constant,
so it can drive a Python loop and shapes; each distinct value compiles once.
The same step is run with two configurations, and again with the first one to
show the cached executable is reused.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def local_sgd(w, x, inner_steps, y):
  def loss(w):
    return jnp.mean((x @ w - y) ** 2)
  for _ in range(inner_steps):  # a Python loop: needs a concrete int
    w = w - 0.05 * jax.grad(loss)(w)
  # Local SGD: average the models once per outer step.
  w = jax.lax.pmean(w, "replicas")
  history = jnp.zeros((inner_steps,), w.dtype) + loss(w)
  return w, history


def run(outer_steps: int = 2) -> dict:
  n = jax.local_device_count()
  rng = np.random.default_rng(10)
  x = rng.normal(size=(n, 8, 3)).astype(np.float32)
  y = rng.normal(size=(n, 8)).astype(np.float32)
  step = jax.pmap(local_sgd, "replicas", static_broadcasted_argnums=(2,))
  results = {}
  for inner in (1, 3, 1):
    w = np.zeros((n, 3), np.float32)
    for _ in range(outer_steps):
      w, history = step(w, x, inner, y)
    results[f"inner_{inner}"] = {"w": w, "history": history}
  return results


if __name__ == "__main__":
  out = run()
  for name, r in out.items():
    print(name, "w:", np.asarray(r["w"][0]), "history length:", r["history"].shape[-1])
