"""brax PPO training on brax's test environment `'fast'`, as brax's own PPO tests run it.

`brax.training.agents.ppo.train` places its training state with `jax.device_put_replicated`,
pmaps `training_epoch` (gradient steps with `pmean` over devices), checks replication with a
pmapped `psum`, and reads results back as device 0's slice. Tiny settings, fixed seed.
"""
from __future__ import annotations

import os
import sys
from typing import Any

import jax
import numpy as np
from brax import envs
from brax.training.agents.ppo import train as ppo


def run(num_timesteps: int = 2048, num_envs: int = 16, num_evals: int = 2,
        max_devices_per_host: int | None = None) -> dict[str, Any]:
  """Trains PPO for a few epochs (on at most ``max_devices_per_host`` devices, brax's own
  option); returns the final parameters and evaluation metrics."""
  environment = envs.get_environment("fast")
  _, (normalizer, policy, value), metrics = ppo.train(
      environment,
      num_timesteps=num_timesteps,
      episode_length=128,
      num_envs=num_envs,
      learning_rate=3e-4,
      entropy_cost=1e-2,
      discounting=0.95,
      unroll_length=5,
      batch_size=16,
      num_minibatches=4,
      num_updates_per_batch=2,
      normalize_observations=True,
      seed=2,
      reward_scaling=10,
      normalize_advantage=False,
      num_evals=num_evals,
      num_eval_envs=8,
      max_devices_per_host=max_devices_per_host,
  )
  # Wall-clock entries (sps, walltime) differ from run to run; everything else is computed.
  computed = {k: v for k, v in metrics.items() if "sps" not in k and "time" not in k}
  return jax.tree_util.tree_map(np.asarray, {
      "normalizer": normalizer, "policy": policy, "value": value, "metrics": computed})


if __name__ == "__main__":
  if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    sys.exit("set XLA_FLAGS=--xla_force_host_platform_device_count=8 before running")
  out = run()
  for name, value in sorted(out["metrics"].items()):
    print(f"{name}: {value}")
