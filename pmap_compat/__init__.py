"""pmap_compat: a drop-in replacement for legacy ``jax.pmap`` built on shard_map_impl + jit.

Same signature, outputs and errors as ``jax.pmap`` in jax 0.6.0, including
host-local/global conversion for multi-process jobs.
"""


def pmap(*args, **kwargs):
  raise NotImplementedError("pmap_compat.pmap is provided by the pmap_compat work (issue 5)")
