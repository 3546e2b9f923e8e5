"""Converted code (jax.jit over JAX's own shard_map, with the support module) run against
legacy jax.pmap on the same program: arrays the mapped function closes over, used in loops,
give legacy's bits and stay constants of the per-device code, as under legacy pmap; and how
often a replicate -> step -> step loop compiles its step."""
import re

import jax
import pytest

from codemod_testing import load, rewrite
from support.compare import assert_trees_equal
from support.compiles import compiles, step_compiles

CONSTANTS = '''
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

_rng = np.random.default_rng(0)
X = jnp.asarray(_rng.normal(size=(40, 3)).astype(np.float32))
Y = jnp.asarray((_rng.uniform(size=40) < 0.5).astype(np.float32))


def potential(w):
  logits = X @ w[1:] + w[0]
  return -(jnp.sum(Y * logits - jax.nn.softplus(logits)) - 0.5 * jnp.sum(w * w))


def leapfrog(w, r):
  r = r - 0.025 * jax.grad(potential)(w)
  w = w + 0.05 * r
  return w, r - 0.025 * jax.grad(potential)(w)


def chain(w0, key):
  def init(c):
    i, key, w = c
    key, sub = jax.random.split(key)
    w = jax.random.uniform(sub, w.shape, minval=-2, maxval=2)
    return i + 1, key, leapfrog(w, -w)[0]
  w = lax.while_loop(lambda c: (c[0] < 3) & jnp.isfinite(potential(c[2])), init,
                     (0, key, w0))[2]

  def outer(w, _):
    w = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, *leapfrog(*c[1:])),
                       (0, w, -w))[1]
    return w, potential(w)
  return lax.scan(outer, w, None, length=4)


step = jax.pmap(chain)


def inputs():
  n = jax.local_device_count()
  w0 = np.random.default_rng(1).normal(size=(n, 4)).astype(np.float32)
  return w0, jax.random.split(jax.random.PRNGKey(0), n)


def run():
  return step(*inputs())
'''

TARGETS = {"experimental": {"target": "experimental"}, "jax": {"target": "jax"}}


def _converted(source, target, name):
  new, findings = rewrite(source, **TARGETS[target])
  assert not [f for f in findings if f.severity.value == "ERROR"], findings
  assert "jax.pmap" not in new
  return load(new, name, with_jax_shard_map=target == "jax")


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_closed_over_arrays_in_loops_give_legacy_bits(target):
  legacy = load(CONSTANTS, "constants_legacy").run()
  ours = _converted(CONSTANTS, target, f"constants_{target}").run()
  assert_trees_equal(legacy, ours)


def test_closed_over_arrays_stay_constants_of_the_per_device_code():
  """Legacy pmap has no manual conversion: the arrays are constants of its per-device
  program. The converted site must not hand them in as shard_map operands."""
  module = _converted(CONSTANTS, "experimental", "constants_lowered")
  text = module.step.lower(*module.inputs()).as_text()
  assert re.search(r"stablehlo\.constant dense<.*> : tensor<40x3xf32>", text)
  assert not re.search(r"@SPMDFullToShardShape\(%[\w#]+\).*: \(tensor<40x3xf32>\) ->", text)


LOOP = '''
import functools

import jax
import jax.numpy as jnp
import numpy as np


@functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0,))
def train_step(state, batch):
  loss, grads = jax.value_and_grad(
      lambda w: jnp.mean((batch["x"] @ w - batch["y"]) ** 2))(state["w"])
  grads = jax.lax.pmean(grads, "batch")
  return {"step": state["step"] + 1, "w": state["w"] - 0.1 * grads}, jax.lax.pmean(loss, "batch")


def run():
  n = jax.local_device_count()
  rng = np.random.default_rng(5)
  state = jax.device_put_replicated({"step": np.int32(0), "w": np.zeros((3,), np.float32)},
                                    jax.local_devices())
  losses = []
  for _ in range(3):
    x = rng.normal(size=(n, 4, 3)).astype(np.float32)
    state, loss = train_step(state, {"x": x, "y": x.sum(-1)})
    losses.append(loss)
  return jax.device_get((state, losses))
'''


def test_replicate_loop_gives_legacy_bits():
  legacy = load(LOOP, "loop_legacy").run()
  assert_trees_equal(legacy, _converted(LOOP, "experimental", "loop_bits").run())


def test_replicate_loop_compiles_its_step_as_often_as_legacy():
  legacy = load(LOOP, "loop_legacy_count")
  jax.clear_caches()
  with compiles() as legacy_counts:
    legacy.run()
  ours = _converted(LOOP, "experimental", "loop_count")
  jax.clear_caches()
  with compiles() as counts:
    ours.run()
  assert step_compiles(legacy_counts, "train_step") == 1
  assert step_compiles(counts, "train_step") == 1, dict(counts)


CHECKED_FIELDS = '''
import jax
import jax.numpy as jnp
import numpy as np


@jax.tree_util.register_pytree_node_class
class Counter:
  """A pytree that converts its fields when built (brax's UInt64, a flax.struct
  dataclass, does the same): it takes arrays and numbers, not placeholders."""

  def __init__(self, hi, lo):
    self.hi = jnp.uint32(hi)
    self.lo = jnp.uint32(lo)

  def tree_flatten(self):
    return (self.hi, self.lo), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    del aux
    return cls(*children)


@jax.pmap
def tick(counter, x):
  return Counter(counter.hi, counter.lo + 1), x * 2


def run():
  n = jax.local_device_count()
  counter = Counter(np.zeros(n, np.uint32), np.arange(n, dtype=np.uint32))
  x = np.ones((n, 3), np.float32)
  for _ in range(2):
    counter, x = tick(counter, x)
  return jax.device_get((counter.hi, counter.lo, x))
'''


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_outputs_in_a_pytree_that_checks_its_fields(target):
  """Legacy pmap (and jit) build an output pytree from its arrays only; the converted site
  must too, though the shard_map it runs may match outputs with out_specs by rebuilding
  the tree from placeholders (jax 0.6.0's)."""
  legacy = load(CHECKED_FIELDS, "checked_legacy").run()
  assert_trees_equal(legacy, _converted(CHECKED_FIELDS, target, f"checked_{target}").run())
