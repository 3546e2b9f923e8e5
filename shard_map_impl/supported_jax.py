"""Which JAX releases ``shard_map_impl`` and ``pmap_compat`` run on.

Both packages build on JAX internals (``jax._src.core``, ``partial_eval``, ``mlir``, ...)
that change between releases, so on any other release they stop at import with this
message instead of failing deep inside JAX on a missing private name. This module
imports nothing of JAX's but its version.
"""
from __future__ import annotations

import jax

SUPPORTED = ("0.6.0", "0.10.2")


def require_supported_jax() -> None:
  """Raises ImportError naming the supported releases when the installed jax is another."""
  if jax.__version__ not in SUPPORTED:
    raise ImportError(
        f"shard_map_impl and pmap_compat support jax {' and '.join(SUPPORTED)} "
        f"(jax and jaxlib pinned to it); this is jax {jax.__version__}. Install "
        f"jax=={SUPPORTED[-1]} jaxlib=={SUPPORTED[-1]}. pmap_compat.testing and the "
        "codemod's output run on jax 0.4.35 to 0.10.2.")
