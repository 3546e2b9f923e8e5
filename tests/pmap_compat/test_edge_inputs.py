"""Edge inputs where pmap_compat once differed from legacy jax.pmap: each runs the same
input under both and compares the outcome (result bit for bit, or exception type and
message); off jax 0.6.0 legacy's recorded outcome is the reference."""

import collections
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from legacy_messages import same_message
from pmap_compat import pmap
from support.compare import compare_with_legacy
from support.jax_lines import has, legacy_reference


# The functions of the tracing-error cases come first: legacy's messages name their source
# lines, which the recordings store (re-record them when these lines move).
def _traced_bool(value):
  return 1 if value.sum() > 0 else 0


Pair = collections.namedtuple("Pair", "a b")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DataPair:
  a: np.ndarray
  b: np.ndarray


class KeyedPair:
  """A pytree class registered with keys (its leaves are named p.a, p.b)."""

  def __init__(self, a, b):
    self.a, self.b = a, b


jax.tree_util.register_pytree_with_keys(
    KeyedPair,
    lambda p: (((jax.tree_util.GetAttrKey("a"), p.a), (jax.tree_util.GetAttrKey("b"), p.b)), None),
    lambda _, children: KeyedPair(*children))


class Model:
  def apply(self, x, y):
    return _traced_bool(y)


def _on_field_b(p):
  return _traced_bool(p.b)


def _named_and_gathered(x, y=1, **kw):
  return _traced_bool(kw["w"])


def _unmapped(x, y):
  return _traced_bool(y["q"])


def _after_static(x, s, y):
  return _traced_bool(y)


def _only_varargs(*args, **kwargs):
  return _traced_bool(kwargs["w"])


def _under_jit(v):
  return _traced_bool(v)


def _inner_second(a, b):
  return _traced_bool(b)


def _inner_keyword(a, *, scale):
  return _traced_bool(scale)


def _outer_passing_keyword(pm):
  return lambda x, y: pm(_inner_keyword, "j")(x, scale=y)


def _float_of_second(x, y):
  return x * float(y)


def _index_with_second(x, y):
  return x * [1, 2][y.astype(int)]


def arr(*shape):
  return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + 1


ONES = np.ones(8, np.float32)

# Tracing errors name the user's parameter, as legacy's do, whatever its kind.
TRACING_ERRORS = {
    "dataclass_field": lambda pm: pm(_on_field_b)(DataPair(ONES, ONES)),
    "keyed_pytree_attribute": lambda pm: pm(_on_field_b)(KeyedPair(ONES, ONES)),
    "namedtuple_field": lambda pm: pm(_on_field_b)(Pair(ONES, ONES)),
    "named_and_gathered_keywords": lambda pm: pm(_named_and_gathered)(ONES, y=ONES, w=ONES),
    "in_axes_none_argument": lambda pm: pm(_unmapped, in_axes=(0, None))(ONES, {"q": ONES}),
    "after_a_static_argument": lambda pm: pm(_after_static, static_broadcasted_argnums=1)(
        ONES, 3, ONES),
    "varargs_and_kwargs_only": lambda pm: pm(_only_varargs)(ONES, w=ONES),
    "bound_method": lambda pm: pm(Model().apply)(ONES, ONES),
    "inside_a_user_jit": lambda pm: jax.jit(lambda a: pm(_under_jit)(a))(ONES),
    "concretization": lambda pm: pm(_float_of_second)(ONES, ONES),
    "integer_conversion": lambda pm: pm(_index_with_second)(ONES, ONES),
    "nested_inner_second": lambda pm: pm(lambda x, y: pm(_inner_second, "j")(x, y), "i")(
        np.ones((2, 4)), np.ones((2, 4))),
    "nested_inner_keyword": lambda pm: pm(_outer_passing_keyword(pm), "i")(
        np.ones((2, 4)), np.ones((2, 4))),
    "nested_inner_after_static": lambda pm: pm(
        lambda x: pm(_after_static, "j", static_broadcasted_argnums=1)(x, 2, x), "i")(
            np.ones((2, 4))),
}


@pytest.mark.parametrize("case", sorted(TRACING_ERRORS))
def test_tracing_error_names_the_users_parameter(case):
  same_message(TRACING_ERRORS[case])


# axis_size: any integral value, checked per call against the mapped size (as legacy).

@pytest.mark.parametrize("size", [np.int64(8), np.int32(8), np.uint8(8)],
                         ids=lambda size: type(size).__name__)
def test_axis_size_numpy_integer(size):
  compare_with_legacy(lambda pm: pm(lambda x: x * 2, axis_size=size)(arr(8, 3)), pmap)


def test_axis_size_true_is_one():
  compare_with_legacy(lambda pm: pm(lambda x: x + 1, axis_size=True)(arr(1, 3)), pmap)


def test_axis_size_zero_is_legacys_mismatch_error():
  same_message(lambda pm: pm(lambda x: x, axis_size=0)(arr(8)))


def test_axis_size_negative_is_legacys_mismatch_error():
  same_message(lambda pm: pm(lambda x: x, axis_size=-1)(arr(8)))


def test_axis_size_float_is_a_type_error():
  """Legacy fails later with an MLIR TypeError; ours names axis_size when pmap is applied."""
  compare_with_legacy(lambda pm: pm(lambda x: x, axis_size=8.0)(arr(8)), pmap)
  with pytest.raises(TypeError, match=r"pmap axis_size must be an integer or None, got 8\.0 "
                                      r"of type float"):
    pmap(lambda x: x, axis_size=8.0)


def test_axis_size_string_is_a_type_error():
  """Legacy compares '8' with 8 and reports "axis_size 8 doesn't match received axis_size 8";
  ours refuses the value itself, naming axis_size."""
  with pytest.raises(TypeError, match="pmap axis_size must be an integer or None, got '8'"):
    pmap(lambda x: x, axis_size="8")


def test_axis_size_zero_with_nothing_mapped():
  """Every in_axes None (legacy refuses that, we take the size from axis_size): a size of
  0 is refused by name."""
  compare_with_legacy(lambda pm: pm(lambda x: x, in_axes=None, axis_size=0)(arr(3)), pmap)
  with pytest.raises(ValueError, match="axis_size must be at least 1 when every in_axes is "
                                       "None, got axis_size=0"):
    pmap(lambda x: x, in_axes=None, axis_size=0)(arr(3))


# Repeated / negative static and donated positions.

def _static_program(static, *, in_axes=0):
  def program(pm):
    g = pm(lambda x, n, m: x * n + m, static_broadcasted_argnums=static, in_axes=in_axes)
    return g(arr(8, 2), 2, 3), g(arr(8, 2), 4, 3), g(arr(8, 2), 2, 3)
  return program


@pytest.mark.parametrize("static", [(1, 1, 2), (2, 1, 2), (1, 2, -1), (-1, 1, 2)], ids=str)
def test_repeated_static_argnums(static):
  compare_with_legacy(_static_program(static), pmap)


def test_repeated_static_argnums_with_in_axes_tuple():
  compare_with_legacy(_static_program((2, 1, 2), in_axes=(0, None, None)), pmap)


def test_negative_static_position_maps_the_argument():
  """A deliberate difference: legacy's Python maps an argument at a negative static
  position, but its C++ cache hashes it first (an array: "Non-hashable static
  arguments"). Ours maps it without hashing: legacy's result without the negative entry."""
  def program(pm):
    static = -1 if pm is pmap else ()
    return pm(lambda x, y: x * y, static_broadcasted_argnums=static)(arr(8, 2), arr(8, 2))
  compare_with_legacy(program, pmap)
  if has("legacy_pmap"):
    with pytest.raises(ValueError, match="Non-hashable static arguments"):
      legacy_reference()(lambda x, y: x * y, static_broadcasted_argnums=-1)(arr(8, 2), arr(8, 2))


def test_repeated_static_argnums_missing_argument_message():
  same_message(lambda pm: pm(lambda x, n: x, static_broadcasted_argnums=(1, 1))(arr(8)))


@pytest.mark.parametrize("donate", [(0, 0), (1, 1, 0), (-1,)], ids=str)
def test_repeated_donate_argnums(donate):
  def program(pm):
    x, y = jnp.asarray(arr(8, 2)), jnp.asarray(arr(8, 2))
    return pm(lambda a, b: a * b + 1, donate_argnums=donate)(x, y)
  compare_with_legacy(program, pmap)


def test_repeated_donate_and_static_argnums():
  compare_with_legacy(lambda pm: pm(lambda n, x: x + n, donate_argnums=(1, 1),
                                    static_broadcasted_argnums=(0, 0))(2, jnp.asarray(arr(8))),
                      pmap)
  same_message(lambda pm: pm(lambda n, x: x + n, donate_argnums=(1, 1),
                             static_broadcasted_argnums=(1, 1)))


# A mapped axis of size 0: legacy aborts the process, ours names the argument.

@pytest.mark.parametrize("program, where", [
    (lambda: pmap(lambda x: x + 1)(jnp.zeros((0,))), r"axis 0 of argument x of type f(loat)?32\[0\]"),
    (lambda: pmap(lambda x, y: x + y, in_axes=(None, 1))(1.0, np.zeros((3, 0), np.int32)),
     r"axis 1 of argument y of type i(nt)?32\[3,0\]"),
    (lambda: pmap(lambda x, **kw: x)(np.zeros((0, 2)), k=np.zeros((0, 2))),
     r"axis 0 of argument x of type f(loat)?(32|64)\[0,2\]"),
    (lambda: pmap(lambda x: x, axis_size=0)(jnp.zeros((0,))),
     r"axis 0 of argument x of type f(loat)?32\[0\]"),
    (lambda: jax.jit(pmap(lambda x: x * 2))(jnp.zeros((0, 3))),
     r"axis 0 of argument x of type f(loat)?32\[0,3\]"),
    (lambda: pmap(lambda x: pmap(lambda v: v, "j")(x), "i")(jnp.zeros((2, 0))),
     r"axis 0 of argument v of type f(loat)?32\[0\]"),
], ids=["plain", "in_axes_1", "with_kwargs", "axis_size_0", "under_jit", "nested_inner"])
def test_zero_size_mapped_axis_names_the_argument(program, where):
  with pytest.raises(ValueError, match=f"pmap cannot map over an axis of size 0: {where} is "
                                       "empty"):
    program()


# Unhashable callables, invalid argument types.

class _Unhashable:
  __hash__ = None  # type: ignore[assignment]

  def __call__(self, x):
    return x + 1


def test_unhashable_callable():
  same_message(lambda pm: pm(_Unhashable())(arr(8)))


def test_unhashable_callable_raises_when_applied():
  """A deliberate difference: legacy raises the same TypeError only at the first call."""
  with pytest.raises(TypeError, match="unhashable type: '_Unhashable'"):
    pmap(_Unhashable())


OBJECTS = np.array([object()] * 8)


@pytest.mark.parametrize("in_axes", [0, (0, None), (None, 0)], ids=str)
def test_object_dtype_argument_is_named(in_axes):
  same_message(lambda pm: pm(lambda x, y: x, in_axes=in_axes)(arr(8), OBJECTS))


def test_string_argument_not_mapped():
  same_message(lambda pm: pm(lambda x, s: x, in_axes=(0, None))(arr(8), "abc"))


# Needing more devices than exist.

def needs_sixteen(x):
  return x + 1


@pytest.mark.parametrize("program", [
    lambda pm: jax.jit(pm(needs_sixteen))(np.ones(16)),
    lambda pm: jax.jit(lambda x: pm(needs_sixteen)(x) * 2)(np.ones(16)),
], ids=["jit_of_pmap", "pmap_in_jitted_function"])
def test_jit_of_pmap_needing_too_many_devices_names_the_computation(program):
  same_message(program)


def test_pmap_needing_too_many_devices():
  same_message(lambda pm: pm(needs_sixteen)(np.ones(16)))
  same_message(lambda pm: jax.grad(lambda x: pm(needs_sixteen)(x).sum())(np.ones(16)))


# Invalid argument types met off the top-level path.

def test_invalid_argument_of_a_nested_pmap_is_named():
  same_message(lambda pm: pm(lambda a: pm(lambda x, s: x, in_axes=(0, None))(a, "abc"))(
      np.ones((2, 4))))


def _strict(pm):
  return functools.partial(pm, check_replicated=True) if pm is pmap else pm


@pytest.mark.parametrize("program", [
    lambda pm: jax.jit(lambda a: pm(lambda x, y: x)(a, OBJECTS))(ONES),
    lambda pm: jax.grad(lambda a: pm(lambda x, y: x)(a, OBJECTS).sum())(ONES),
    lambda pm: _strict(pm)(lambda x, y: x)(ONES, OBJECTS),
], ids=["under_jit", "under_grad", "check_replicated"])
def test_object_dtype_argument_off_the_top_level_path_is_named(program):
  same_message(program)


def test_float0_numpy_input():
  """A float0 input stays a numpy array (no device buffer holds one) all the way."""
  from jax import dtypes
  float0 = np.array([b""] * jax.device_count(), dtype=dtypes.float0)
  outcome = compare_with_legacy(lambda pm: pm(lambda x: x)(float0), pmap)
  assert outcome.value.dtype == dtypes.float0
