"""`make demo`: run the shipped examples and print their results."""
from __future__ import annotations

import os
import runpy
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
  import jax
  print(f"jax {jax.__version__}, {jax.local_device_count()} local devices")
  example = os.path.join(ROOT, "examples", "dp_sgd.py")
  print(f"== examples/dp_sgd.py under legacy jax.pmap")
  runpy.run_path(example, run_name="__main__")
  return 0


if __name__ == "__main__":
  sys.exit(main())
