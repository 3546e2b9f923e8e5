"""Errors with legacy's wording (row 28)."""

import re

import jax
import numpy as np
import pytest
from jax import lax

from pmap_compat import pmap
from legacy_messages import same_message
from support.compare import compare_call


def test_inconsistent_sizes():
  def f(x, y):
    return x
  same_message(lambda pm: pm(f)(np.ones((8, 2)), np.ones(4)))


def test_inconsistent_sizes_many_args_and_kwargs():
  def f(a, b, c, *, d):
    return a
  same_message(lambda pm: pm(f, in_axes=(0, 1, 0))(
      np.ones((8, 2)), {"k": np.ones((3, 4))}, [np.ones(8), np.ones(4)], d=np.ones((4, 1))))


def test_too_many_devices():
  same_message(lambda pm: pm(lambda x: x)(np.ones((9, 2))))


def test_rank_zero_input():
  same_message(lambda pm: pm(lambda x: x)(np.float32(1)))


def test_python_scalar_mapped():
  same_message(lambda pm: pm(lambda x, y: x + y)(np.ones(8), 2.0))


def test_in_axes_past_rank():
  same_message(lambda pm: pm(lambda x: x, in_axes=2)(np.ones((8, 2))))


def test_unbound_axis_name():
  out = compare_call(lambda x: lax.psum(x, "j"), (np.ones(8),), pmap, axis_name="i")
  assert isinstance(out.error, NameError)
  with pytest.raises(NameError, match="unbound axis name: j"):
    pmap(lambda x: lax.psum(x, "j"), "i")(np.ones(8))


def test_no_arguments():
  same_message(lambda pm: pm(lambda: 1.0)())


def test_all_none_in_axes():
  same_message(lambda pm: pm(lambda x: x, in_axes=None)(np.ones(3)))


def test_axis_size_mismatch():
  same_message(lambda pm: pm(lambda x: x, axis_size=2)(np.ones(8)))


def test_static_argnum_out_of_range():
  same_message(lambda pm: pm(lambda x, n=1: x, static_broadcasted_argnums=1)(np.ones(8)))


def test_in_axes_not_a_prefix():
  same_message(lambda pm: pm(lambda x, y: x, in_axes=(0,))(np.ones(8), np.ones(8)))
  same_message(lambda pm: pm(lambda x: x, in_axes=({"a": 0},))(np.ones(8)))


def test_in_axes_not_a_prefix_with_kwargs():
  same_message(lambda pm: pm(lambda x, *, k: x, in_axes=(0, 0))(np.ones(8), k=np.ones(8)))


def test_out_axes_not_a_prefix():
  same_message(lambda pm: pm(lambda x: (x, x), out_axes=(0, 0, 0))(np.ones(8)))


def test_error_inside_fun_propagates_unchanged():
  def f(x):
    raise KeyError("boom")
  compare_call(f, (np.ones(8),), pmap)
  with pytest.raises(KeyError, match="boom"):
    pmap(f)(np.ones(8))


def test_not_callable():
  for pm in (jax.pmap, pmap):
    with pytest.raises(TypeError):
      pm(3)(np.ones(8))


def _traced_bool(value):
  return 1 if value.sum() > 0 else 0


# Functions that branch on a traced value: the tracing error names the argument it came from.
NAMED_ARGUMENTS = {
    "first": (lambda x, y: _traced_bool(x), (np.ones((8, 2)), np.ones(8)), {}, {}),
    "dict_leaf": (lambda x, d: _traced_bool(d["b"]),
                  (np.ones(8), {"a": np.ones(8), "b": np.ones(8)}), {}, {}),
    "extra_positional": (lambda a, *rest: _traced_bool(rest[1]), (np.ones(8),) * 3, {}, {}),
    "keyword": (lambda x, *, n: _traced_bool(n), (np.ones(8),), {"n": np.ones(8)}, {}),
    "gathered_keywords": (lambda x, **kw: _traced_bool(kw["z"]), (np.ones(8),),
                          {"z": np.ones(8)}, {}),
    "after_static": (lambda k, x, t: _traced_bool(t), (3, np.ones(8), np.ones(8)), {},
                     {"static_broadcasted_argnums": 0}),
}


@pytest.mark.parametrize("case", sorted(NAMED_ARGUMENTS))
def test_tracing_error_names_the_argument_like_legacy(case):
  fun, args, kwargs, pmap_kwargs = NAMED_ARGUMENTS[case]
  legacy = compare_call(fun, args, pmap, kwargs=kwargs, **pmap_kwargs)
  with pytest.raises(jax.errors.TracerBoolConversionError) as ours:
    pmap(fun, **pmap_kwargs)(*args, **kwargs)

  def named(message):
    return re.search(r"the function (\S+) .*the value of the argument (.*?)\.\n", message, re.S)
  expected = named(str(legacy.error))
  assert expected is not None, legacy.error
  assert named(str(ours.value)).groups() == expected.groups()


@pytest.mark.parametrize("case", sorted(NAMED_ARGUMENTS))
def test_tracing_error_text_is_legacys(case):
  """The whole message, including "while tracing the function f at ... for pmap"."""
  fun, args, kwargs, pmap_kwargs = NAMED_ARGUMENTS[case]
  same_message(lambda pm: pm(fun, **pmap_kwargs)(*args, **kwargs))


def test_tracing_error_text_in_a_nested_pmap_is_legacys():
  inner = lambda v: _traced_bool(v)
  same_message(lambda pm: pm(lambda x: pm(inner, "j")(x), "i")(np.ones((2, 4))))
