"""Caches live as long as the mapped function, as legacy pmap's do: a training loop
that builds ``pmap(lambda ...)`` afresh must not accumulate executables. And
``jax.clear_caches()`` empties every cache pmap_compat keeps, as it does legacy pmap's."""
import gc
import weakref

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import pmap_compat
from pmap_compat import inputs, meshes, multihost
from support.jax_lines import has, requires

LEGACY_RUNTIME = has("legacy_pmap")
if LEGACY_RUNTIME:  # the C++ pmap path's executable table and PmapSharding conversions
  from pmap_compat import fastpath, outputs


def _programs() -> int:
  return fastpath._executables.cache_info().currsize


def test_dropped_functions_release_their_executables():
  x = np.zeros((8,), np.float32)
  gc.collect()
  before = _programs() if LEGACY_RUNTIME else 0
  refs = []
  for i in range(10):
    fun = lambda v, i=i: v + i  # noqa: E731
    refs.append(weakref.ref(fun))
    np.testing.assert_array_equal(pmap_compat.pmap(fun)(x), x + i)
    del fun
  gc.collect()
  assert all(r() is None for r in refs), "a dropped function is still referenced"
  if LEGACY_RUNTIME:
    assert _programs() <= before  # earlier tests' programs may go too


@requires("legacy_pmap", "the C++ pmap path's executable table")
def test_live_function_keeps_its_executable_across_wrappers():
  x = np.arange(8, dtype=np.float32)
  fun = lambda v: v * 3  # noqa: E731
  pmap_compat.pmap(fun)(x)
  programs = fastpath._executables.cache_keys()  # held here, so none can be collected meanwhile
  out = pmap_compat.pmap(fun)(x)  # a new wrapper of the same function: no new program
  added = [k for k in fastpath._executables.cache_keys() if not any(k == p for p in programs)]
  assert added == []
  np.testing.assert_array_equal(out, x * 3)


CACHES = {
    "meshes": meshes._mesh,
    "local meshes": multihost._local_mesh,
}
if LEGACY_RUNTIME:  # without legacy's runtime jit itself reshards inputs on the program's devices
  CACHES.update({
      "reshard programs": inputs._reshard_program,
      "executables": fastpath._executables,
      "PmapSharding of NamedSharding": outputs._pmap_sharding_cached,
      "NamedSharding of PmapSharding": outputs.named_of_pmap_cached,
  })


def test_clear_caches_empties_every_cache():
  f = pmap_compat.pmap(lambda v: v * 2)
  x = np.arange(16, dtype=np.float32).reshape(8, 2)
  f(f(x))                                             # executables, meshes, shardings
  reversed_mesh = Mesh(np.array(jax.devices()[::-1]), ("a",))
  f(jax.device_put(x, NamedSharding(reversed_mesh, P("a"))))
  grid = Mesh(np.array(jax.devices()).reshape(4, 2), ("a", "b"))
  f(jax.device_put(x, NamedSharding(grid, P("a", "b"))))  # same devices, other blocks
  multihost._local_mesh(meshes.build_mesh([("i", 8)], None, None, False))
  filled = [name for name, c in CACHES.items() if c.cache_info().currsize]
  assert sorted(filled) == sorted(CACHES), f"not exercised: {set(CACHES) - set(filled)}"
  assert f._cache_size > 0
  jax.clear_caches()
  left = {name: c.cache_info().currsize for name, c in CACHES.items()
          if c.cache_info().currsize}
  assert not left, f"jax.clear_caches() left entries in {left}"
  assert f._cache_size == 0  # the C++ dispatch cache (legacy's per wrapper; jit's on 0.10)
  np.testing.assert_array_equal(np.asarray(f(x)), x * 2)  # and it still works afterwards
