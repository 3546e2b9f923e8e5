"""pmap_compat: a drop-in replacement for legacy ``jax.pmap`` built on shard_map_impl + jit.

Same signature, semantics and errors as legacy ``jax.pmap``, on every release
``shard_map_impl.supported_jax`` lists (``jax_line`` holds what differs: where legacy pmap's
runtime remains, results are legacy's ``PmapSharding`` arrays; where it is gone, the
NamedSharding arrays that release's own ``jax.pmap`` returns).
``patched()`` / ``patch()`` / ``unpatch()`` make ``jax.pmap`` itself resolve to it.

``pmap_compat.testing`` (record a program's outputs, check them later, possibly on
another JAX) uses only public JAX and numpy and imports on older JAX releases too.
So this package imports nothing eagerly: the public names below load their modules
(which build on JAX internals of the supported releases) on first access.
"""
from __future__ import annotations

import importlib
from typing import Any

# Public name -> the module that defines it.
_LAZY = {
    "pmap": "pmap_compat.api",
    "patch": "pmap_compat.patching",
    "patched": "pmap_compat.patching",
    "unpatch": "pmap_compat.patching",
    "UnpatchedPmapWarning": "pmap_compat.patching",
}

__all__ = ["pmap", "patch", "patched", "unpatch", "UnpatchedPmapWarning"]


def __getattr__(name: str) -> Any:
  if name not in _LAZY:
    raise AttributeError(f"module 'pmap_compat' has no attribute {name!r}")
  # Before any module built on JAX internals: a clear error on an unsupported JAX.
  from shard_map_impl.supported_jax import require_supported_jax
  require_supported_jax()
  value = getattr(importlib.import_module(_LAZY[name]), name)
  globals()[name] = value  # later lookups skip this hook
  return value


def __dir__() -> list[str]:
  return sorted(set(globals()) | set(__all__))
