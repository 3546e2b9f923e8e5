"""pmap_compat: a drop-in replacement for legacy ``jax.pmap`` built on shard_map_impl + jit.

Same signature, outputs and errors as ``jax.pmap`` in jax 0.6.0. ``patched()`` /
``patch()`` / ``unpatch()`` make ``jax.pmap`` itself resolve to it.
"""
from pmap_compat.api import pmap
from pmap_compat.patching import patch, patched, unpatch

__all__ = ["pmap", "patch", "patched", "unpatch"]
