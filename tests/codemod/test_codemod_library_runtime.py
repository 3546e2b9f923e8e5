"""Library code that maps a user's function: the pmap's options reach it at run time
(flax's ``nnx.pmap`` passes its own ``axis_name=None`` default, ``in_axes`` and
``out_axes`` trees, ``axis_size`` and ``static_broadcasted_argnums`` through variables).
The converted wrapper must behave as legacy ``jax.pmap`` on jax 0.6.0, for each set of
options a caller may give."""
import jax
import numpy as np
import pytest

from codemod_testing import load, rewrite
from support.compare import assert_trees_equal

LIBRARY = '''\
import jax


def pmap(f, *, in_axes=0, out_axes=0, axis_name=None, axis_size=None,
         static_broadcasted_argnums=()):
  return jax.pmap(f, axis_name=axis_name, in_axes=in_axes, out_axes=out_axes,
                  axis_size=axis_size, static_broadcasted_argnums=static_broadcasted_argnums)
'''


def _double(x):
  return x * 2


def _scaled(x, scale):
  return x * scale


def _tree(x, params):
  return {"y": x["a"] + params["w"], "z": x["b"] * 2}


def _summed(x):
  return jax.lax.psum(x, "batch"), x + 1


def _static(x, k):
  return x * k


def _cases(n):
  x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
  tree = {"a": x, "b": x[:, :2] + 1}
  return {
      # axis_name=None, the library's default, with pmap's default axes.
      "unnamed": (_double, {}, (x,)),
      "unnamed_broadcast": (_scaled, {"in_axes": (0, None)}, (x, np.float32(3))),
      "unnamed_axis_1": (_double, {"in_axes": 1, "out_axes": 1}, (x.T,)),
      "unnamed_tree": (_tree, {"in_axes": ({"a": 0, "b": 0}, {"w": None})},
                       (tree, {"w": np.float32(2)})),
      "named_collective": (_summed, {"axis_name": "batch", "out_axes": (None, 0)}, (x,)),
      "static": (_static, {"static_broadcasted_argnums": (1,)}, (x, 4)),
      "axis_size": (_scaled, {"in_axes": (0, None), "axis_size": n}, (x, np.float32(3))),
  }


CASES = sorted(_cases(2))


@pytest.fixture(scope="module")
def libraries():
  new, findings = rewrite(LIBRARY, target="experimental")
  assert not [f for f in findings if f.severity.value == "ERROR"], findings
  assert "jax.pmap" not in new
  return load(LIBRARY, "legacy_library"), load(new, "converted_library")


@pytest.mark.parametrize("case", CASES)
def test_library_wrapper_runs_as_legacy_pmap(libraries, case):
  legacy, converted = libraries
  fun, options, args = _cases(jax.local_device_count() // 2)[case]
  expected = legacy.pmap(fun, **options)(*args)
  assert_trees_equal(converted.pmap(fun, **options)(*args), expected)
