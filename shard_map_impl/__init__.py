"""shard_map_impl: an independent, complete ``shard_map`` for jax 0.6.0.

Our own primitive and every rule JAX needs for it (staging, replication
checking, lowering, eager execution, batching, autodiff, remat, DCE), agreeing
with ``jax.experimental.shard_map`` on every program and coexisting with it.
"""


def shard_map(*args, **kwargs):
  raise NotImplementedError(
      "shard_map_impl.shard_map is provided by the shard_map_impl primitive work (issue 3)")
