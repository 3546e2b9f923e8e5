"""Make sure JAX sees enough fake CPU devices before any test imports it.

``--xla_force_host_platform_device_count`` only takes effect if it is in
``XLA_FLAGS`` when the CPU backend is first created, so it must be set before
``jax`` is imported. If jax was imported earlier with fewer devices there is
no way to fix it in-process, and we refuse to run rather than silently test
everything on one device.
"""
from __future__ import annotations

import os
import re
import sys

FLAG = "--xla_force_host_platform_device_count"


class DeviceCountError(RuntimeError):
  """Raised when the process cannot provide the requested number of CPU devices."""


def _with_device_flag(flags: str, count: int) -> str:
  flags = re.sub(rf"{FLAG}=\S*", "", flags).strip()
  return f"{flags} {FLAG}={count}".strip()


def require_host_devices(count: int = 8) -> int:
  """Ensures at least ``count`` CPU devices; returns the number available.

  Raises DeviceCountError when jax was already initialised with fewer.
  """
  if "jax" not in sys.modules:
    os.environ["XLA_FLAGS"] = _with_device_flag(os.environ.get("XLA_FLAGS", ""), count)
  import jax  # pylint: disable=import-outside-toplevel

  have = len(jax.devices("cpu"))
  if have < count:
    raise DeviceCountError(
        f"the test suite needs {count} CPU devices but jax was initialised with {have}. "
        f"jax was imported before tests/conftest.py could set XLA_FLAGS={FLAG}={count}; "
        f"set it in the environment or import jax later.")
  return have
