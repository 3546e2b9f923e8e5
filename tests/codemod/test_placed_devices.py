"""A function that places its pmapped inputs on ``jax.local_devices()[:n]`` itself (brax's
trainers, with ``max_devices_per_host``) gets a shared mesh over ``pmap_devices(rows=n)``:
as many devices as legacy pmap mapped those inputs over. Before/after text, the cases left
over ``jax.devices()``, and, against legacy jax.pmap on jax 0.6.0, results and compiles on
fewer devices than the host has."""
from __future__ import annotations

import textwrap

import jax
import numpy as np
import pytest

from codemod_testing import load, rewrite
from support.compare import assert_trees_equal
from support.compiles import compiles, step_compiles

TRAINER = '''\
import jax
import numpy as np

_AXIS = "i"


def train(params, steps, max_devices_per_host=None):
  local_devices_to_use = jax.local_device_count()
  if max_devices_per_host:
    local_devices_to_use = min(local_devices_to_use, max_devices_per_host)

  def epoch(p, key):
    return p - 0.1 * jax.lax.pmean(p * key, _AXIS)

  epoch = jax.pmap(epoch, axis_name=_AXIS, donate_argnums=(0,))
  total = jax.pmap(lambda p: jax.lax.psum(p, _AXIS), axis_name=_AXIS)

  params = jax.device_put_replicated(params, jax.local_devices()[:local_devices_to_use])
  for step in range(steps):
    keys = np.full((local_devices_to_use, 3), step + 1.0, np.float32)
    params = epoch(params, keys)
  return params, total(params)
'''


def _converted(source: str) -> tuple[str, list]:
  return rewrite(textwrap.dedent(source), target="experimental")


def _changed(source: str, changes: list[tuple[str, str]]) -> str:
  for old, new in changes:
    assert old in source
    source = source.replace(old, new)
  return source


def test_the_shared_mesh_spans_the_devices_the_function_places_inputs_on():
  new, findings = _converted(TRAINER)
  assert new.count("jax.sharding.Mesh(") == 1, new
  assert "mesh = jax.sharding.Mesh(pmap_devices(rows=local_devices_to_use), (_AXIS,))" in new
  assert "from pmap_shard_map import per_device, placed_on, pmap_devices" in new
  infos = [f.message for f in findings if "pmap converted" in f.message]
  line = 1 + next(i for i, text in enumerate(TRAINER.splitlines()) if "device_put" in text)
  assert len(infos) == 2, infos
  assert all(f"places its inputs on, line {line}" in m for m in infos), infos


def _trained(source: str, name: str, most: int | None) -> list:
  """(result, compiles) of ``source``'s ``train`` as written (legacy pmap), then
  converted, on at most ``most`` devices."""
  new, _ = _converted(source)
  assert "pmap_devices(rows=" in new, new
  params = np.arange(3, dtype=np.float32)
  runs = []
  for kind, text in (("legacy", source), ("converted", new)):
    module = load(text, f"{name}_{kind}_{most}")
    with compiles() as counts:
      out = module.train(params, 3, max_devices_per_host=most)
    runs.append((out, counts))
  return runs


@pytest.mark.jax06_only(reason="compares with legacy jax.pmap")
@pytest.mark.parametrize("most", [None, 2, 1])
@pytest.mark.parametrize("program", ["TRAINER", "THROUGH_HELPER"])
def test_on_fewer_devices_results_and_compiles_are_legacys(program, most):
  (legacy, legacy_counts), (ours, our_counts) = _trained(globals()[program], program, most)
  assert_trees_equal(legacy, ours)
  assert legacy[0].shape[0] == (most or jax.local_device_count())
  for step in ("epoch", "<lambda>"):
    assert step_compiles(our_counts, step) == step_compiles(legacy_counts, step) == 1, (
        legacy_counts, our_counts)


_PLACEMENT = "jax.local_devices()[:local_devices_to_use])"


@pytest.mark.parametrize("changes", [
    # n bound again after the first site: its value there is not the placement's
    [("  return params, total(params)\n",
      "  local_devices_to_use = 1\n  return params, total(params)\n")],
    # placements on different counts
    [("  for step in range(steps):\n",
      "  extra = jax.device_put_replicated(params, jax.local_devices()[:1])\n"
      "  for step in range(steps):\n")],
    # a placement on every local device
    [(_PLACEMENT, "jax.local_devices())")],
    # a list the function does not spell as a slice of JAX's devices
    [(_PLACEMENT, "pool)"),
     ("  params = jax.device_put_replicated(",
      "  pool = jax.local_devices()[:local_devices_to_use]\n"
      "  params = jax.device_put_replicated(")],
    # a count from a call that may do anything
    [(_PLACEMENT, "jax.local_devices()[:pick()])")],
    # a module-level name: another function may bind it again
    [(_PLACEMENT, "jax.local_devices()[:_MOST])"), ('_AXIS = "i"\n', '_AXIS = "i"\n_MOST = 2\n')],
])
def test_a_count_not_shown_to_hold_at_the_mesh_leaves_it_over_jax_devices(changes):
  new, _ = _converted(_changed(TRAINER, changes))
  assert "mesh = jax.sharding.Mesh(jax.devices(), (_AXIS,))" in new, new
  assert "pmap_devices" not in new, new


# brax SAC's: a private helper places the state on as many devices as its parameter says.
THROUGH_HELPER = TRAINER.replace(
    "  params = jax.device_put_replicated(params, jax.local_devices()[:local_devices_to_use])\n",
    "  params = _placed(params, count=local_devices_to_use)\n").replace(
    "\n\ndef train(", """

def _placed(params, count):
  return jax.device_put_replicated(params, jax.local_devices()[:count])


def train(""")


def test_a_private_helper_places_them_on_as_many_as_its_argument_says():
  assert THROUGH_HELPER != TRAINER
  new, _ = _converted(THROUGH_HELPER)
  assert "mesh = jax.sharding.Mesh(pmap_devices(rows=local_devices_to_use), (_AXIS,))" in new


@pytest.mark.parametrize("changes", [
    # public: another module may bind it again
    [("def _placed(", "def placed("), ("_placed(params, count", "placed(params, count")],
    # its parameter bound again before the placement
    [("  return jax.device_put", "  count = 1\n  return jax.device_put")],
    # decorated
    [("def _placed(", "@functools.cache\ndef _placed(")],
])
def test_a_helper_that_may_place_them_otherwise_says_nothing(changes):
  new, _ = _converted(_changed(THROUGH_HELPER, changes))
  assert "mesh = jax.sharding.Mesh(jax.devices(), (_AXIS,))" in new, new


def test_flax_replicate_with_devices_counts_too():
  new, _ = _converted('''\
      import jax
      from flax import jax_utils


      def train(state, batches, n):
        step = jax.pmap(lambda s, b: s + jax.lax.pmean(b, "batch"), axis_name="batch")
        state = jax_utils.replicate(state, devices=jax.local_devices()[:n])
        for batch in batches:
          state = step(state, batch)
        return state
      ''')
  assert 'mesh = jax.sharding.Mesh(pmap_devices(rows=n), ("batch",))' in new, new


# brax ARS's: nothing placed; the keys each call gets are split into n rows, in a jitted
# function that calls the site.
SPLIT_KEYS = '''\
import jax
import jax.numpy as jnp


def train(params, steps, max_devices_per_host=None):
  local_devices_to_use = jax.local_device_count()
  if max_devices_per_host:
    local_devices_to_use = min(local_devices_to_use, max_devices_per_host)

  def run_episode(p, noise, key):
    return jax.lax.pmean(p + noise * jax.random.uniform(key, p.shape), "i")

  prun_episode = jax.pmap(run_episode, axis_name="i", in_axes=(None, 0, 0))

  @jax.jit
  def epoch(p, key):
    key, key_noise, key_eval = jax.random.split(key, 3)
    noise = jax.random.normal(key_noise, (local_devices_to_use,) + p.shape)
    key_eval = jax.random.split(key_eval, local_devices_to_use)
    return prun_episode(p, noise, key_eval)[0], key

  key = jax.random.PRNGKey(0)
  for _ in range(steps):
    params, key = epoch(params, key)
  return params
'''


def test_the_mesh_spans_the_rows_split_keys_give_each_call():
  new, findings = _converted(SPLIT_KEYS)
  assert 'mesh = jax.sharding.Mesh(pmap_devices(rows=local_devices_to_use), ("i",))' in new, new
  line = 1 + next(i for i, text in enumerate(SPLIT_KEYS.splitlines())
                  if "split(key_eval" in text)
  infos = [f.message for f in findings if "pmap converted" in f.message]
  assert len(infos) == 1 and f"jax.random.split makes for its calls, line {line}" in infos[0], (
      infos)


@pytest.mark.jax06_only(reason="compares with legacy jax.pmap")
@pytest.mark.parametrize("most", [None, 2, 1])
def test_split_rows_on_fewer_devices_give_legacys_results_and_compiles(most):
  (legacy, legacy_counts), (ours, our_counts) = _trained(SPLIT_KEYS, "split", most)
  assert_trees_equal(legacy, ours)
  if most == 1:
    # On one device, jit keeps legacy's output on that device as the host's params were
    # (one compile); the site's output there is on a one-device mesh, which the jitted
    # epoch compiles again for (left as it is: jit over a pmap on one device).
    assert step_compiles(legacy_counts, "epoch") + 1 == step_compiles(our_counts, "epoch")
    return
  # The first epoch gets host params, the next ones its own output: jit compiles twice.
  assert step_compiles(our_counts, "epoch") == step_compiles(legacy_counts, "epoch"), (
      legacy_counts, our_counts)


_SPLIT = "key_eval = jax.random.split(key_eval, local_devices_to_use)"


@pytest.mark.parametrize("changes", [
    # n means every local device: the mesh over jax.devices() says so already
    [(_SPLIT, "key_eval = jax.random.split(key_eval, jax.local_device_count())")],
    # the split value is not the one the call passes
    [("prun_episode(p, noise, key_eval)", "prun_episode(p, noise, key_eval[::-1][:1])")],
    # its position is not mapped over axis 0
    [("in_axes=(None, 0, 0)", "in_axes=(None, 0, None)")],
    # another call of the site gets rows from elsewhere
    [("  key = jax.random.PRNGKey(0)\n",
      "  key = jax.random.PRNGKey(0)\n  prun_episode(params, params[None], key[None])\n")],
    # the site is handed on: its calls cannot all be seen
    [("  return params\n", "  return params, prun_episode\n")],
    # n bound again after the mesh
    [("  key = jax.random.PRNGKey(0)\n",
      "  key = jax.random.PRNGKey(0)\n  local_devices_to_use = 1\n")],
    # a key bound on one branch only
    [(_SPLIT, _SPLIT + "\n    if p.sum() > 0:\n      key_eval = key[None]")],
])
def test_rows_not_shown_to_come_from_split_leave_the_mesh_over_jax_devices(changes):
  new, _ = _converted(_changed(SPLIT_KEYS, changes))
  assert 'mesh = jax.sharding.Mesh(jax.devices(), ("i",))' in new, new
  assert "pmap_devices" not in new, new


# optax's apply_if_finite test: each call passes an array made with one row, a number
# times jnp.ones([1]), whatever the host's device count.
MADE_ROWS = '''\
import jax
import jax.numpy as jnp


def train(params, steps, max_devices_per_host=None):
  half = jnp.ones([1]) / 2.0
  two = -(2 * jnp.ones((1,)))

  def update(p, x):
    return p + jax.lax.psum(jnp.arctanh(x) * p, axis_name="i")

  update = jax.pmap(update, axis_name="i")
  params = jax.tree.map(lambda x: x[None], params)
  params = update(params, half)
  for _ in range(steps):
    params = update(params, two)
  return params
'''


def test_the_mesh_spans_the_rows_of_the_arrays_each_call_is_given():
  new, findings = _converted(MADE_ROWS)
  assert 'mesh = jax.sharding.Mesh(pmap_devices(rows=1), ("i",))' in new, new
  line = 1 + next(i for i, text in enumerate(MADE_ROWS.splitlines()) if "half =" in text)
  infos = [f.message for f in findings if "pmap converted" in f.message]
  assert len(infos) == 1 and f"the rows jnp.ones makes for its calls, line {line}" in infos[0], (
      infos)


@pytest.mark.jax06_only(reason="compares with legacy jax.pmap")
def test_made_rows_on_fewer_devices_give_legacys_results_and_compiles():
  (legacy, legacy_counts), (ours, our_counts) = _trained(MADE_ROWS, "made", None)
  assert_trees_equal(legacy, ours)
  assert legacy.shape == (1, 3)
  assert step_compiles(our_counts, "update") == step_compiles(legacy_counts, "update"), (
      legacy_counts, our_counts)


_HALF = "half = jnp.ones([1]) / 2.0"


@pytest.mark.parametrize("changes", [
    # times an array, which may have more rows
    [(_HALF, "half = jnp.ones([1]) / params")],
    # a shape this cannot read
    [(_HALF, "half = jnp.ones(params.shape)")],
    # a shape with no rows
    [(_HALF, "half = jnp.ones(())")],
    # rows for every local device: the mesh over jax.devices() says so already
    [(_HALF, "half = jnp.ones([jax.local_device_count()]) / 2.0")],
    # another binding reaches the call
    [("  params = update(params, half)\n",
      "  if steps:\n    half = params\n  params = update(params, half)\n")],
    # a call of another maker with other rows
    [("two = -(2 * jnp.ones((1,)))", "two = -(2 * jnp.ones((2,)))")],
])
def test_rows_not_shown_by_the_arrays_made_leave_the_mesh_over_jax_devices(changes):
  new, _ = _converted(_changed(MADE_ROWS, changes))
  assert 'mesh = jax.sharding.Mesh(jax.devices(), ("i",))' in new, new
  assert "pmap_devices" not in new, new
