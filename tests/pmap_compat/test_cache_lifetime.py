"""Caches live as long as the mapped function, as legacy pmap's do: a training loop
that builds ``pmap(lambda ...)`` afresh must not accumulate executables."""
import gc
import weakref

import numpy as np

import pmap_compat
from pmap_compat import fastpath


def test_dropped_functions_release_their_executables():
  x = np.zeros((8,), np.float32)
  gc.collect()
  before = len(fastpath._compiled)
  refs = []
  for i in range(10):
    fun = lambda v, i=i: v + i  # noqa: E731
    refs.append(weakref.ref(fun))
    np.testing.assert_array_equal(pmap_compat.pmap(fun)(x), x + i)
    del fun
  gc.collect()
  assert all(r() is None for r in refs), "a dropped function is still referenced"
  assert len(fastpath._compiled) <= before  # earlier tests' programs may go too


def test_live_function_keeps_its_executable_across_wrappers():
  x = np.arange(8, dtype=np.float32)
  fun = lambda v: v * 3  # noqa: E731
  pmap_compat.pmap(fun)(x)
  programs = list(fastpath._compiled.keys())  # held here, so none can be collected meanwhile
  out = pmap_compat.pmap(fun)(x)  # a new wrapper of the same function: no new program
  added = [p for p in fastpath._compiled.keys() if not any(p is q for q in programs)]
  assert added == []
  np.testing.assert_array_equal(out, x * 3)
