"""brax ARS (augmented random search) on brax's test environment `'fast'`, as brax's own ARS
tests run it.

`brax.training.agents.ars.train` pmaps its episode runner over the devices, inside a jitted
training epoch, on as many devices as the keys it splits per call have rows:
`max_devices_per_host` makes that fewer than the host's devices. Tiny settings, fixed seed.
"""
from __future__ import annotations

import os
import sys
from typing import Any

import jax
import numpy as np
from brax import envs
from brax.training.agents.ars import train as ars


def run(num_timesteps: int = 4096, max_devices_per_host: int | None = None) -> dict[str, Any]:
  """Trains ARS for a few epochs (on at most ``max_devices_per_host`` devices, brax's own
  option); returns the final parameters and evaluation metrics."""
  environment = envs.get_environment("fast")
  _, (normalizer, policy), metrics = ars.train(
      environment,
      num_timesteps=num_timesteps,
      episode_length=64,
      number_of_directions=8,
      top_directions=4,
      num_eval_envs=8,
      num_evals=2,
      normalize_observations=True,
      seed=3,
      max_devices_per_host=max_devices_per_host,
  )
  # Wall-clock entries (sps, walltime) differ from run to run; everything else is computed.
  computed = {k: v for k, v in metrics.items() if "sps" not in k and "time" not in k}
  return jax.tree_util.tree_map(np.asarray, {
      "normalizer": normalizer, "policy": policy, "metrics": computed})


if __name__ == "__main__":
  if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    sys.exit("set XLA_FLAGS=--xla_force_host_platform_device_count=8 before running")
  out = run(max_devices_per_host=2)
  for name, value in sorted(out["metrics"].items()):
    print(f"{name}: {value}")
