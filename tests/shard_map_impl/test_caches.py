"""shard_map_impl's caches are bounded and emptied by ``jax.clear_caches()``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import shard_map_impl
from shard_map_impl import device_witness, eager, per_device
from support.meshes import make_mesh

CACHES = {
    "device witness": device_witness._witness_parts,
    "manual meshes": per_device._manual_mesh,
    "eager converters": eager._converter,
    "eager primitive programs": eager._jitted,
}


def test_clear_caches_empties_every_cache():
  mesh = make_mesh((4, 2))
  f = shard_map_impl.shard_map(lambda x: jax.lax.psum(jnp.sin(x), "x"), mesh,
                               in_specs=P("x"), out_specs=P())
  x = jnp.arange(16.0).reshape(8, 2)
  f(x)  # eager: converters and per-primitive programs
  jax.jit(f)(x)  # staged: witness and manual mesh
  filled = {name: c.cache_info().currsize for name, c in CACHES.items()}
  assert all(filled.values()), filled
  assert all(c.cache_info().maxsize for c in CACHES.values())  # bounded
  jax.clear_caches()
  assert {name: c.cache_info().currsize for name, c in CACHES.items()} == dict.fromkeys(CACHES, 0)
