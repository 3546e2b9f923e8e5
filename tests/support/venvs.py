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

# The supported JAX lines: .venv has the legacy one, .venv-jax<NEWEST> the newest.
LEGACY = "0.6.0"
NEWEST = "0.10.2"
# Older lines the recording and guide tests run code on too.
OLDER = ("0.4.38", "0.7.2")
# Every release `make venvs` builds an environment for, oldest first: the releases pip
# serves for Python 3.11 from 0.4.35 to the newest (tests/test_release_smoke.py smokes
# each; `make test-all` runs the default suites on each).
RELEASES = ("0.4.35", "0.4.38", "0.5.3", "0.6.0", "0.6.2", "0.7.0", "0.7.2", "0.8.0",
            "0.8.2", "0.9.0", "0.9.2", "0.10.0", NEWEST)


def python_for(version: str) -> str:
  """Path of the python of jax `version`'s environment (`.venv` for 0.6.0,
  `.venv-jax<version>` otherwise); raises if `make venvs` has not built it."""
  venv = os.path.join(ROOT, ".venv" if version == LEGACY else f".venv-jax{version}")
  if not os.path.exists(os.path.join(venv, ".installed")):
    raise RuntimeError(f"no jax {version} environment at {venv}; run `make venvs` (make test "
                       "does it)")
  return os.path.join(venv, "bin", "python")


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
