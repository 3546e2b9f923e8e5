"""numpyro NUTS with parallel chains (8 by default) on a small logistic regression.

numpyro's `MCMC(..., chain_method="parallel")` runs its chains under `pmap` (numpyro binds
`from jax import pmap` at import), one device per chain: with fewer chains than devices,
pmap maps over the first `num_chains` devices. The model closes over the data `x`, `y`,
as user models do, so the data reach the compiled sampler as constants. Synthetic data,
fixed seeds.
"""
from __future__ import annotations

import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.infer import MCMC, NUTS

# The function numpyro pmaps (MCMC._single_chain_mcmc through functools.partial).
STEP_FUNCTIONS = ("_single_chain_mcmc",)
NUM_CHAINS = 8


def _data(num_points: int, num_features: int) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(0)
  x = rng.normal(size=(num_points, num_features)).astype(np.float32)
  true_w = rng.normal(size=(num_features,)).astype(np.float32)
  logits = x @ true_w + 0.5
  y = (rng.uniform(size=num_points) < 1 / (1 + np.exp(-logits))).astype(np.float32)
  return x, y


def run(num_warmup: int = 20, num_samples: int = 20, num_points: int = 100,
        num_features: int = 3, num_chains: int = NUM_CHAINS) -> dict[str, Any]:
  """Samples the posterior of a logistic regression; returns samples and NUTS statistics."""
  x_np, y_np = _data(num_points, num_features)
  x, y = jnp.asarray(x_np), jnp.asarray(y_np)

  def model() -> None:
    w = numpyro.sample("w", dist.Normal(jnp.zeros(num_features), 1.0).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    numpyro.sample("y", dist.Bernoulli(logits=x @ w + b), obs=y)

  mcmc = MCMC(NUTS(model), num_warmup=num_warmup, num_samples=num_samples,
              num_chains=num_chains, chain_method="parallel", progress_bar=False)
  mcmc.run(jax.random.PRNGKey(0), extra_fields=("num_steps", "potential_energy", "accept_prob"))
  samples = mcmc.get_samples(group_by_chain=True)
  extra = mcmc.get_extra_fields(group_by_chain=True)
  return jax.tree_util.tree_map(np.asarray, {"samples": samples, "extra": extra})


if __name__ == "__main__":
  if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    sys.exit("set XLA_FLAGS=--xla_force_host_platform_device_count=8 before running")
  out = run()
  for name, value in sorted(out["samples"].items()):
    print(f"{name}: shape {value.shape}, chain means {np.round(value.mean(axis=1), 4).tolist()}")
  print("num_steps per chain:", out["extra"]["num_steps"].sum(axis=1).tolist())
