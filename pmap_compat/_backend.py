"""The one place pmap_compat imports its shard_map from (our own shard_map_impl)."""
from shard_map_impl import shard_map  # noqa: F401
