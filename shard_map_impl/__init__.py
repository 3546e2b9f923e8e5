"""shard_map_impl: an independent, complete ``shard_map``.

Our own primitive and every rule JAX needs for it (staging, replication
checking, lowering, eager execution, batching, autodiff, remat, DCE), agreeing
with the installed JAX's own shard_map (``jax.experimental.shard_map`` or
``jax.shard_map``) on every program and coexisting with it. ``shard_map`` takes
either call form; what differs between releases is confined to ``jax_line``.
The releases it runs on: ``supported_jax``.
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
