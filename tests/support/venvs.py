"""The project's other JAX environments, which `make test` creates (see the Makefile).

Tests that must run code on another JAX line call `python_for(version)` and run that
interpreter in a subprocess. A missing environment is an error, not a skip: CI goes
through `make test`, which builds them all.
"""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The JAX lines `make venvs` builds besides .venv (jax 0.6.0).
NEWEST = "0.10.2"
OLDER = ("0.4.38", "0.7.2")


def python_for(version: str) -> str:
  """Path of the python of `.venv-jax<version>`; raises if `make venvs` has not built it."""
  path = os.path.join(ROOT, f".venv-jax{version}", "bin", "python")
  if not os.path.exists(os.path.join(ROOT, f".venv-jax{version}", ".installed")):
    raise RuntimeError(
        f"no jax {version} environment at {os.path.dirname(os.path.dirname(path))}; "
        "run `make venvs` (make test does it)")
  return path


def run_python(version: str, args: list[str], *, env: dict[str, str] | None = None,
               timeout: float = 300, cwd: str | None = None) -> subprocess.CompletedProcess:
  """Runs `python args...` in the jax `version` environment with 8 CPU devices."""
  full_env = dict(os.environ)
  full_env.pop("PYTHONPATH", None)
  full_env["JAX_PLATFORMS"] = "cpu"
  full_env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
  full_env.update(env or {})
  return subprocess.run([python_for(version), *args], env=full_env, cwd=cwd or ROOT,
                        capture_output=True, text=True, timeout=timeout, check=False)


def current_python() -> str:
  """The python running the main suite (jax 0.6.0)."""
  return sys.executable
