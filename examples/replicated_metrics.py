"""Metrics returned once, not once per device: `out_axes=None`.

The step returns per-device outputs (stacked along axis 0, as usual) together
with a dict of metrics that are all-reduced inside the step and therefore equal
on every device; `out_axes=(0, None)` returns that dict a single time, with no
leading device axis, so the host loop does not need `[0]` everywhere.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.partial(jax.pmap, axis_name="i", out_axes=(0, None))
def score(logits, labels):
  log_probs = jax.nn.log_softmax(logits)
  nll = -jnp.take_along_axis(log_probs, labels[:, None], axis=-1)[:, 0]
  metrics = {
      "loss": jax.lax.pmean(jnp.mean(nll), "i"),
      "max_loss": jax.lax.pmax(jnp.max(nll), "i"),
      "min_loss": jax.lax.pmin(jnp.min(nll), "i"),
      "count": jax.lax.psum(labels.shape[0], "i"),
      "hits": jax.lax.psum(jnp.sum(jnp.argmax(logits, -1) == labels), "i"),
  }
  return nll, metrics


def run(steps: int = 3) -> dict:
  n_dev = jax.local_device_count()
  rng = np.random.default_rng(5)
  history = []
  per_example = None
  for _ in range(steps):
    logits = rng.normal(size=(n_dev, 6, 4)).astype(np.float32)
    labels = rng.integers(0, 4, size=(n_dev, 6)).astype(np.int32)
    per_example, metrics = score(logits, labels)
    history.append(metrics)
  return {"per_example_nll": per_example,
          "history": jax.tree.map(lambda *v: jnp.stack(v), *history)}


if __name__ == "__main__":
  out = run()
  for k, v in out["history"].items():
    print(f"{k:>8}: {np.asarray(v)}")
