"""Arrays the mapped function closes over (model data, tables), used inside loops and
out of them: the reference pmap's bits, and its way of handing them to the per-device
code. Legacy pmap lowers them as constants of the per-device program; a shard_map under
jit would pass them in as operands, which XLA optimises differently inside loops (numpyro's
NUTS drifted by 1-3 ulp that way). jax 0.10's own pmap passes them as operands, and so
must we there."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pmap_compat import pmap
from support.compare import assert_trees_equal
from support.jax_lines import has
from support.legacy_pmap import reference_pmap

ROWS, COLS = 40, 3


def data(as_array):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(ROWS, COLS)).astype(np.float32)
  y = (rng.uniform(size=ROWS) < 0.5).astype(np.float32)
  return as_array(x), as_array(y)


def make(kind, x, y):
  def potential(w):
    logits = x @ w[1:] + w[0]
    return -(jnp.sum(y * logits - jax.nn.softplus(logits)) - 0.5 * jnp.sum(w * w))

  def leapfrog(w, r):
    r = r - 0.025 * jax.grad(potential)(w)
    w = w + 0.05 * r
    return w, r - 0.025 * jax.grad(potential)(w)

  def f(w0, key):
    if kind == "straight":
      return w0 - 0.01 * jax.grad(potential)(w0), potential(w0)
    if kind == "fori":
      return lax.fori_loop(0, 6, lambda i, w: w - 0.01 * jax.grad(potential)(w), w0)
    if kind == "while":
      def body(c):
        i, key, w = c
        key, sub = jax.random.split(key)
        w = jax.random.uniform(sub, w.shape, minval=-2, maxval=2)
        return i + 1, key, leapfrog(w, -w)[0]
      return lax.while_loop(lambda c: (c[0] < 4) & jnp.isfinite(potential(c[2])), body,
                            (0, key, w0))[2]
    if kind == "scan":
      return lax.scan(lambda w, _: (leapfrog(w, w)[0], potential(w)), w0, None, length=5)
    if kind == "nested":
      def outer(w, _):
        w = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, *leapfrog(*c[1:])),
                           (0, w, -w))[1]
        w = lax.cond(potential(w) < 50.0, lambda: w, lambda: w * 0.5)
        return w, potential(w)
      return lax.scan(outer, w0, None, length=3)
    raise ValueError(kind)
  return f


KINDS = ("straight", "fori", "while", "scan", "nested")
AS_ARRAY = {"numpy": np.asarray, "jax": jnp.asarray}


def inputs():
  n = jax.local_device_count()
  w0 = np.random.default_rng(1).normal(size=(n, COLS + 1)).astype(np.float32)
  return w0, jax.random.split(jax.random.PRNGKey(0), n)


@pytest.mark.parametrize("as_array", sorted(AS_ARRAY))
@pytest.mark.parametrize("kind", KINDS)
def test_closed_over_arrays_give_the_reference_bits(kind, as_array):
  f = make(kind, *data(AS_ARRAY[as_array]))
  _, reference = reference_pmap()
  assert_trees_equal(reference(f)(*inputs()), pmap(f)(*inputs()))


def operand_constants(text):
  """Does the (StableHLO) program hand a closed-over array into its per-device code as an
  operand of the manual conversion (GSPMD) or region (Shardy)?"""
  kind = rf"tensor<{ROWS}x{COLS}xf32>"
  gspmd = re.search(rf"@SPMDFullToShardShape\(%[\w#]+\).*: \({kind}\) ->", text)
  shardy = re.search(rf"sdy\.manual_computation\([^)]*\)[^\n]*\(%arg\d+: {kind}", text)
  return bool(gspmd or shardy)


def embedded_constants(text):
  return len(re.findall(rf"stablehlo\.constant dense<.*> : tensor<{ROWS}x{COLS}xf32>", text))


@pytest.mark.parametrize("kind", KINDS)
def test_closed_over_arrays_reach_the_per_device_code_as_the_reference_hands_them(kind):
  f = make(kind, *data(jnp.asarray))
  _, reference = reference_pmap()
  expected = reference(f).lower(*inputs()).as_text()
  ours = pmap(f).lower(*inputs()).as_text()
  assert embedded_constants(ours) >= 1
  assert operand_constants(ours) == operand_constants(expected)


@pytest.mark.filterwarnings("ignore:The jitted function .* includes a pmap:UserWarning")
@pytest.mark.xfail(has("legacy_pmap") and not has("legacy_pmap_numpy_under_jit"), strict=True,
                   reason="the reference, legacy jax.pmap, fails inside jax.jit with numpy "
                   "arguments here (capability legacy_pmap_numpy_under_jit absent)")
def test_arrays_of_an_enclosing_trace_stay_arguments():
  """Closed over inside a user's jit, the arrays are tracers: operands, as legacy's."""
  _, reference = reference_pmap()

  def program(pm, x, y):
    return pm(make("fori", x, y))(*inputs())
  args = data(jnp.asarray)
  expected = jax.jit(lambda x, y: program(reference, x, y))(*args)
  assert_trees_equal(expected, jax.jit(lambda x, y: program(pmap, x, y))(*args))
