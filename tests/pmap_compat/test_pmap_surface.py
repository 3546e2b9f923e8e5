"""The wrapper surface: wraps, signature, .lower/.trace, cache (rows 24-27)."""
import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from pmap_compat import pmap
from steady_state import warm_calls
from support.compare import assert_trees_equal, compare_with_legacy
from support.jax_lines import requires
from support.legacy_pmap import legacy_reference, reference_pmap


def arr(*shape):
  return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + 1


def documented(x, y=2.0, *, z):
  """Adds things."""
  return {"sum": x + y + z, "prod": (x * z,)}


def test_wraps_attributes_and_signature():
  legacy, ours = reference_pmap()[1](documented), pmap(documented)
  for attr in ("__name__", "__qualname__", "__doc__", "__module__", "__wrapped__"):
    assert getattr(ours, attr) == getattr(legacy, attr), attr
  assert inspect.signature(ours) == inspect.signature(legacy) == inspect.signature(documented)


def test_decorator_and_partial_forms():
  @pmap
  def f(x):
    return x * 2

  @functools.partial(pmap, axis_name="i")
  def g(x):
    return lax.psum(x, "i")
  assert f.__name__ == "f" and g.__name__ == "g"
  assert_trees_equal(jax.pmap(lambda x: x * 2)(arr(8)), f(arr(8)))
  assert_trees_equal(jax.pmap(lambda x: lax.psum(x, "i"), "i")(arr(8)), g(arr(8)))


def _lowered_program(pm):
  f = pm(documented, in_axes=(0, None))
  lowered = f.lower(arr(8, 2), 3.0, z=arr(8, 2))
  text = lowered.as_text()
  assert isinstance(text, str) and "func" in text
  lowered.cost_analysis()  # must not raise
  compiled = lowered.compile()
  return compiled(arr(8, 2), 3.0, z=arr(8, 2) * 2)


def test_lower_compile_call_returns_fun_output_tree():
  compare_with_legacy(_lowered_program, pmap)


def test_lower_after_call_and_trace():
  f = pmap(lambda x: jnp.sin(x) + lax.axis_index("i"), "i")
  first = f(arr(8, 3))
  lowered = f.lower(arr(8, 3))
  assert_trees_equal(first, lowered.compile()(arr(8, 3)))
  traced = f.trace(arr(8, 3))
  assert "sin" in str(traced.jaxpr)
  assert_trees_equal(first, traced.lower().compile()(arr(8, 3)))


def test_lower_on_a_temporary_wrapper():
  text = pmap(lambda x: jnp.cos(x) * 7, "i").lower(arr(8)).as_text()
  assert "cosine" in text


def _cache_program(pm):
  """Legacy's cache surface: ``_cache_size`` is an int per wrapper, ``_cache_clear()``."""
  def f(x):
    return x * 3
  g = pm(f)
  sizes = [g._cache_size]
  g(arr(8))
  g(arr(8) + 1)
  sizes.append(g._cache_size)
  out = g(arr(8, 2))                 # new shape: retrace
  sizes.append(g._cache_size)
  g(arr(4))                          # new mapped size
  sizes.append(g._cache_size)
  h = pm(f)                          # a new wrapper starts with its own (empty) call cache
  sizes.append(h._cache_size)
  g._cache_clear()
  sizes.append(g._cache_size)
  return out, g(arr(8)), sizes


@requires("legacy_pmap", "legacy's call cache is per wrapper; without it jit shares its call "
          "cache between the jit objects of one function")
def test_cache_size_retrace_on_new_shapes_and_clear():
  legacy = compare_with_legacy(_cache_program, pmap)
  assert legacy.value[2] == [0, 1, 2, 3, 0, 0]


def test_new_wrapper_of_same_function_shares_cache():
  traces = []

  def f(x):
    traces.append(x.shape)
    return x + 1
  for _ in range(3):
    pmap(f)(arr(8, 2))
  assert len(traces) == 1
  pmap(f, axis_name="other")(arr(8, 2))   # different parameters: its own cache entry
  assert len(traces) == 2


def test_cache_distinguishes_static_values_and_dtypes():
  traces = []

  def f(x, n):
    traces.append(n)
    return x * n
  g = pmap(f, static_broadcasted_argnums=1)
  g(arr(8), 2)
  g(arr(8), 2)
  g(arr(8), 3)
  g(arr(8).astype(np.int32), 3)
  assert traces == [2, 3, 3]


def test_second_call_with_different_tree_retraces():
  compare_with_legacy(lambda pm: [pm(lambda t: jax.tree.map(lambda v: v * 2, t))(a)
                                  for a in (arr(8), {"a": arr(8)}, (arr(8, 1), arr(8, 2)))], pmap)


def _make_doubler():
  def doubler(x):
    return jnp.sin(x) * 2
  return doubler


def test_default_axis_name_gives_deterministic_hlo():
  # Two distinct (but identical) functions, unnamed axis: the same staged program (the jaxpr
  # names the mesh axis) and the same lowered text.
  x = arr(8, 3)
  first, second = (pmap(_make_doubler()) for _ in range(2))
  assert str(first.trace(x).jaxpr) == str(second.trace(x).jaxpr)
  assert "mesh=Mesh(" in str(first.trace(x).jaxpr)
  assert first.lower(x).as_text() == second.lower(x).as_text()


@requires("legacy_pmap", "the C++ pmap dispatcher; without it: test_outputs_jax010.py")
def test_steady_state_calls_run_no_python_of_ours():
  x, ours = warm_calls(pmap(lambda x: x * 2 + 1, "i"), arr(8, 3))
  assert ours == [], ours
  legacy = legacy_reference()(lambda v: v * 2 + 1)
  assert_trees_equal(legacy(legacy(legacy(legacy(arr(8, 3))))), x)
