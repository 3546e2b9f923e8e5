"""Calls served outside the C++ fast path (``.lower().compile()``, ``check_replicated``,
nested pmaps) with inputs that sit on other devices or in other layouts: legacy's results,
and the user's function traced as often as legacy traces it."""
import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from pmap_compat import pmap
from support.compare import compare_with_legacy
from support.legacy_pmap import reference_pmap


def data(*shape):
  return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) % 7 + 1


def on_device(*shape, index=3):
  return jax.device_put(data(*shape), jax.devices()[index])


def reversed_mesh(*shape):
  mesh = Mesh(np.array(jax.devices()[::-1]), ("a",))
  return jax.device_put(data(*shape), NamedSharding(mesh, P("a")))


def legacy_output(*shape):
  return reference_pmap()[1](lambda x: x)(data(*shape))  # legacy's kind where JAX has it


INPUTS = {"other_device": on_device, "reversed_mesh": reversed_mesh,
          "legacy_output": legacy_output}


def collective(x):
  return lax.psum(x, "i") * 10 + x * (lax.axis_index("i") + 1)


def strict(pm, fun, **kwargs):
  """``check_replicated`` only exists in pmap_compat; it sends every call down the slow path."""
  return pm(fun, check_replicated=True, **kwargs) if pm is pmap else pm(fun, **kwargs)


@pytest.mark.parametrize("make", sorted(INPUTS))
def test_compiled_takes_inputs_from_anywhere(make):
  compare_with_legacy(
      lambda pm: pm(collective, "i").lower(INPUTS[make](8, 3)).compile()(INPUTS[make](8, 3)), pmap)


def counting(fun, traces):
  def counted(x):
    traces.append(1)
    return fun(x)
  return counted


@pytest.mark.parametrize("make", sorted(INPUTS))
def test_strict_call_moves_inputs_and_traces_once(make):
  def program(pm):
    traces = []
    out = strict(pm, counting(collective, traces), axis_name="i")(INPUTS[make](8, 3))
    return out, len(traces)
  compare_with_legacy(program, pmap)


@pytest.mark.parametrize("make", sorted(INPUTS))
def test_nested_call_moves_inputs_without_extra_traces(make):
  # Nested pmaps are found by tracing (then traced again over the full mesh), so the
  # count is compared with the same call on host data rather than with legacy's.
  def program(pm, x):
    traces = []
    return pm(pm(counting(collective, traces), "i"), "j")(x), len(traces)
  legacy = compare_with_legacy(lambda pm: program(pm, _nested_input(make))[0], pmap)
  assert legacy.error is None
  on_host = program(pmap, data(2, 4, 3))[1]
  assert program(pmap, _nested_input(make))[1] == on_host


def _nested_input(make: str) -> jax.Array:
  """The (2, 4, 3) input of a nested call, laid out by `make`."""
  if make == "reversed_mesh":
    # Built directly: an eager reshape of the 8-way sharded (8, 3) array into (2, 4, 3)
    # raises IndivisibleError where JAX names the result's sharding on the 1-d mesh.
    mesh = Mesh(np.array(jax.devices()[::-1]).reshape(2, 4), ("a", "b"))
    return jax.device_put(data(2, 4, 3), NamedSharding(mesh, P("a", "b")))
  return INPUTS[make](8, 3).reshape(2, 4, 3)


def test_error_raised_by_the_function_is_not_retried():
  def program(pm):
    calls = []

    def fun(x):
      calls.append(1)
      raise ValueError("the user's own error")
    try:
      strict(pm, fun)(on_device(8, 3))
    except ValueError as e:
      return str(e), len(calls)
    return "no error", len(calls)
  legacy = compare_with_legacy(program, pmap)
  assert legacy.value == ("the user's own error", 1)
