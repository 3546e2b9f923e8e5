"""What a pmap wrapper's methods keep alive: ``pmap(f).lower`` / ``.trace`` own ``f``, so
they keep working after the wrapper (and every other reference to ``f``) is gone, as
legacy's do; dropping them frees ``f`` again."""
import gc
import weakref

import numpy as np

from pmap_compat import pmap
from support.compare import compare_with_legacy


def data() -> np.ndarray:
  return np.arange(16, dtype=np.float32).reshape(8, 2) % 5 + 1


def test_lower_outlives_its_wrapper():
  def program(pm):
    lower = pm(lambda x: x * 3 + 1).lower  # the only reference to the lambda
    gc.collect()
    return lower(data()).compile()(data())
  compare_with_legacy(program, pmap)


def test_trace_outlives_its_wrapper():
  trace = pmap(lambda x: x - 2).trace
  gc.collect()
  compiled = trace(data()).lower().compile()
  np.testing.assert_array_equal(np.asarray(compiled(data())), data() - 2)


def test_dropping_the_methods_frees_the_function():
  fun = lambda x: x + 5  # noqa: E731
  ref = weakref.ref(fun)
  wrapped = pmap(fun)
  lower, trace = wrapped.lower, wrapped.trace
  np.testing.assert_array_equal(np.asarray(wrapped(data())), data() + 5)
  del fun, wrapped
  gc.collect()
  assert ref() is not None, "the methods must keep the function alive"
  del lower, trace
  gc.collect()
  assert ref() is None, "the function outlived every wrapper and method"
