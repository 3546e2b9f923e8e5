"""Caches live as long as the mapped function, as legacy pmap's do: a training loop
that builds ``pmap(lambda ...)`` afresh must not accumulate executables. And
``jax.clear_caches()`` empties every cache pmap_compat keeps, as it does legacy pmap's."""
import gc
import os
import subprocess
import sys
import weakref

import jax
import numpy as np
import pytest
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


_AFTER_CLEAR_BACKENDS = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
import jax, jax.numpy as jnp, numpy as np
from jax._src import api
import pmap_compat
pm = pmap_compat.pmap if sys.argv[1] == "ours" else jax.pmap
x = np.arange(16.0, dtype=np.float32).reshape(8, 2)
with jax.disable_jit(sys.argv[2] == "eager"):
  before = np.asarray(pm(jnp.sin)(x))
  api.clear_backends()  # new device objects from here on
  after = pm(jnp.sin)(x)
print(after.sharding.device_set == set(jax.devices()), np.asarray(after).tobytes().hex())
"""


@pytest.mark.parametrize("mode", ["jit", "eager"])
def test_a_function_mapped_before_clear_backends_maps_onto_the_new_devices(mode):
  """A mesh recorded for a function (here one every program shares, ``jnp.sin``) before
  ``clear_backends()`` holds the old device objects; mapped again it must land on the
  new ones, as under JAX's own pmap. Own processes: the other tests' arrays stay valid."""
  outs = {}
  for impl in ("jax", "ours"):
    proc = subprocess.run([sys.executable, "-c", _AFTER_CLEAR_BACKENDS, impl, mode],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    outs[impl] = proc.stdout.split()
  assert outs["ours"] == outs["jax"]
  assert outs["ours"][0] == "True"
