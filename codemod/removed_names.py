"""Names newest JAX removed, and what ``--target jax`` does with each.

The ``jax.tree_map`` family becomes ``jax.tree.*`` / ``jax.tree_util.*`` (same functions);
``device_put_replicated`` / ``device_put_sharded`` become the support module's exact
equivalents (same values, shapes and per-device placement); the rest has no
mechanical replacement and is reported.
"""
from __future__ import annotations

TREE_RENAMES = {
    "jax.tree_map": "jax.tree.map",
    "jax.tree_multimap": "jax.tree.map",
    "jax.tree_leaves": "jax.tree.leaves",
    "jax.tree_structure": "jax.tree.structure",
    "jax.tree_flatten": "jax.tree.flatten",
    "jax.tree_unflatten": "jax.tree.unflatten",
    "jax.tree_transpose": "jax.tree.transpose",
    "jax.tree_reduce": "jax.tree.reduce",
    "jax.tree_all": "jax.tree.all",
    "jax.tree_util.tree_multimap": "jax.tree_util.tree_map",
}

SUPPORT_CALLS = {
    "jax.device_put_replicated": "device_put_replicated",
    "jax.api.device_put_replicated": "device_put_replicated",
    "jax.device_put_sharded": "device_put_sharded",
    "jax.api.device_put_sharded": "device_put_sharded",
}
SUPPORT_CALL_MESSAGE = ("{old} (removed in newer JAX) rewritten to {module}.{new}, which gives "
                        "the same values, shapes and per-device placement")

# Modules and names with no mechanical replacement: reported, left as they are.
REPORTED = {
    "jax.experimental.maps": "xmap and its mesh moved to shard_map and jax.sharding.Mesh",
    "jax.experimental.host_callback": "use jax.debug.callback / jax.pure_callback",
    "jax.experimental.global_device_array": "use jax.Array",
    "jax.experimental.gda_serialization": "use jax.experimental.array_serialization",
    "jax.abstract_arrays": "use jax.core.ShapedArray",
    "jax.linear_util": "use jax.extend.linear_util",
    "jax.xla_computation": "use jax.jit(f).lower(...).compiler_ir()",
}

LAST_NAMES = frozenset(name.rsplit(".", 1)[1]
                       for name in (*TREE_RENAMES, *SUPPORT_CALLS, *REPORTED))


def reported(qualified_names: set[str]) -> str | None:
  """The guidance for a removed module or name among ``qualified_names`` (or a member)."""
  for name in qualified_names:
    for removed, advice in REPORTED.items():
      if name == removed or name.startswith(removed + "."):
        return f"{removed} is removed in newer JAX: {advice}"
  return None
