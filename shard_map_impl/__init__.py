"""shard_map_impl: an independent, complete ``shard_map`` for jax 0.6.0 and 0.10.2.

Our own primitive and every rule JAX needs for it (staging, replication
checking, lowering, eager execution, batching, autodiff, remat, DCE), agreeing
with JAX's own shard_map on every program and coexisting with it
(``jax.experimental.shard_map`` on 0.6.0, ``jax.shard_map`` on 0.10.2).
``shard_map`` takes either line's call form; what differs between the lines
is confined to ``jax_line``.
"""
import importlib as _importlib

from shard_map_impl.supported_jax import require_supported_jax

require_supported_jax()

from shard_map_impl.primitive import shard_map_p, register_trace_rule  # noqa: E402
from shard_map_impl.api import shard_map  # noqa: E402
from shard_map_impl.smap import smap  # noqa: E402

# Rule modules register themselves on import (order does not matter).
for _name in ("staging", "lowering", "eager", "replication", "checker_rules",
              "batching", "autodiff", "partial_eval", "transpose", "remat",
              "dce", "rewrite_rules", "discharge"):
  _importlib.import_module(f"shard_map_impl.{_name}")

__all__ = ["shard_map", "smap", "shard_map_p", "register_trace_rule"]
