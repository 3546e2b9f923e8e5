"""``.lower()`` / ``.trace()`` / ``.compile()``: argument names in errors and use under
``jax.disable_jit()``, compared with legacy jax.pmap."""
import os

import jax
import numpy as np
import pytest
from jax import core

from legacy_messages import same_message
from pmap_compat import pmap
from support.compare import compare_with_legacy

F32 = np.arange(32, dtype=np.float32).reshape(8, 4)
I32 = F32.astype(np.int32)


def scale(x, n):
  return x * n


def combine(x, d):
  return x + d["a"] * d["b"]


# (function, pmap keyword arguments, arguments to lower with, arguments to call with)
MISMATCHED_TYPES = {
    "first": (lambda x: x * 2, {}, (F32,), (I32,)),
    "second": (scale, {}, (F32, F32), (F32, I32)),
    "pytree_leaf": (combine, {}, (F32, {"a": F32, "b": F32}), (F32, {"a": F32, "b": I32})),
    "star_args": (lambda a, *rest: a + rest[0], {}, (F32, F32), (F32, I32)),
    "static_omitted": (scale, {"static_broadcasted_argnums": 1}, (F32, 3), (I32,)),
}


@pytest.mark.parametrize("disabled", [False, True], ids=["jit", "disable_jit"])
@pytest.mark.parametrize("case", sorted(MISMATCHED_TYPES))
def test_compiled_called_with_other_types_names_the_argument(case, disabled):
  fun, kwargs, lower_args, call_args = MISMATCHED_TYPES[case]
  with jax.disable_jit(disabled):
    same_message(lambda pm: pm(fun, **kwargs).lower(*lower_args).compile()(*call_args))


def test_keyword_argument_named_in_type_error():
  same_message(lambda pm: pm(scale).lower(F32, n=F32).compile()(F32, n=I32))


def test_traced_then_compiled_names_the_argument():
  same_message(lambda pm: pm(scale).trace(F32, F32).lower().compile()(F32, I32))


# (function, arguments to lower with, arguments to call with)
UNDER_DISABLE_JIT = {
    "trivial": (lambda x: x * 2, (F32,), (F32,)),
    "two_args": (scale, (F32, F32 + 1), (F32, F32 + 1)),
    "pytree": (combine, (F32, {"a": F32, "b": F32}), (F32, {"a": F32, "b": F32 - 1})),
    "shaped_array": (lambda x: x * 2, (core.ShapedArray((8, 4), np.float32),), (F32,)),
}


@pytest.mark.parametrize("case", sorted(UNDER_DISABLE_JIT))
@pytest.mark.parametrize("via", ["lower", "trace"])
def test_lower_compile_and_call_under_disable_jit(case, via):
  fun, lower_args, call_args = UNDER_DISABLE_JIT[case]

  def program(pm):
    with jax.disable_jit():
      staged = getattr(pm(fun), via)(*lower_args)
      lowered = staged if via == "lower" else staged.lower()
      return lowered.compile()(*call_args)
  compare_with_legacy(program, pmap)


@pytest.mark.parametrize("call_args", [(F32, (F32,)), (F32,), (F32, F32, F32)],
                         ids=["subtree", "too_few", "too_many"])
def test_in_tree_mismatch_under_disable_jit(call_args):
  def program(pm):
    with jax.disable_jit():
      return pm(scale).lower(F32, F32).compile()(*call_args)
  same_message(program)


def test_stage_objects_are_jax_stage_types_under_disable_jit():
  with jax.disable_jit():
    lowered = pmap(scale).lower(F32, F32)
    compiled = lowered.compile()
    traced = pmap(scale).trace(F32, F32)
  assert isinstance(lowered, jax.stages.Lowered)
  assert isinstance(compiled, jax.stages.Compiled)
  assert isinstance(traced, jax.stages.Traced)
  # The compiled program still runs with jit enabled again, with legacy's result.
  expected = jax.pmap(scale).lower(F32, F32).compile()(F32, F32)
  np.testing.assert_array_equal(np.asarray(compiled(F32, F32)), np.asarray(expected))


def test_traced_jaxpr_debug_info_names_the_function_and_arguments_like_legacy():
  def f(x, d, *, n):
    return x + d["a"] * n

  def described(pm):
    dbg = pm(f).trace(F32, {"a": F32}, n=F32).jaxpr.jaxpr.debug_info
    # "f at /abs/path/file.py:N" -> "f at file.py:N": the recording holds in any clone.
    name, _, where = dbg.func_src_info.partition(" at ")
    return f"{name} at {os.path.basename(where)}", dbg.arg_names, dbg.result_paths
  legacy = compare_with_legacy(described, pmap)
  assert legacy.value[1] == ("x", "d['a']", "n")
