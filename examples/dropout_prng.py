"""Per-device dropout with typed PRNG keys.

Every device gets its own `jax.random.key` (a typed key array, not raw uint32),
splits it each step so no two steps reuse randomness, and applies inverted
dropout to a hidden layer. A second stream folds the device index into one
shared key, the other common way of getting per-device randomness. The new keys
are returned so the loop can carry them, exactly as a training loop does.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

RATE = 0.25


@functools.partial(jax.pmap, axis_name="devices")
def dropout_forward(key, shared_key, x, w):
  key, drop_key = jax.random.split(key)
  hidden = jnp.tanh(x @ w)
  keep = jax.random.bernoulli(drop_key, 1.0 - RATE, hidden.shape)
  hidden = jnp.where(keep, hidden / (1.0 - RATE), 0.0)
  # Noise that differs per device although every device holds the same key.
  device_key = jax.random.fold_in(shared_key, jax.lax.axis_index("devices"))
  noise = jax.random.normal(device_key, (hidden.shape[-1],), hidden.dtype)
  kept_fraction = jax.lax.pmean(keep.mean(), "devices")
  return key, hidden + 0.01 * noise, keep, kept_fraction


def run(steps: int = 3) -> dict:
  n_dev = jax.local_device_count()
  rng = np.random.default_rng(1)
  x = rng.normal(size=(n_dev, 8, 6)).astype(np.float32)
  w = np.broadcast_to(rng.normal(size=(6, 5)).astype(np.float32), (n_dev, 6, 5))
  keys = jax.random.split(jax.random.key(42), n_dev)
  shared = jax.random.split(jax.random.key(7), 1)
  shared = jnp.broadcast_to(shared, (n_dev,))
  hiddens, masks, fractions = [], [], []
  for _ in range(steps):
    keys, hidden, mask, kept = dropout_forward(keys, shared, x, w)
    hiddens.append(hidden)
    masks.append(mask)
    fractions.append(kept)
  return {"keys": keys, "hidden": jnp.stack(hiddens), "mask": jnp.stack(masks),
          "kept_fraction": jnp.stack(fractions)}


if __name__ == "__main__":
  out = run()
  print("key dtype:", out["keys"].dtype, "shape:", out["keys"].shape)
  print("kept fraction per step:", np.asarray(out["kept_fraction"])[:, 0])
  m = np.asarray(out["mask"])
  print("devices draw different masks:", not np.array_equal(m[0, 0], m[0, 1]))
  print("steps draw different masks:", not np.array_equal(m[0, 0], m[1, 0]))
