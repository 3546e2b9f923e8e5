"""Rule: with --target jax, names newest JAX removed are rewritten to what it keeps (the
jax.tree_map family -> jax.tree.* / jax.tree_util.*; device_put_replicated / _sharded
-> the support module's exact equivalents) or reported; --target experimental (older
JAX, where they still exist) leaves them alone."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from codemod_testing import PmapCodemodTest, rewrite, support
from support.compiles import compiles


class TreeFamilyTest(PmapCodemodTest):

  def test_every_spelling_of_the_tree_family(self):
    self.assertConverts("""
        import jax
        import jax.tree_util as tu
        from jax import tree_map, tree_leaves as leaves

        a = jax.tree_map(f, x)
        b = jax.tree_multimap(f, x, y)
        c = leaves(x)
        d = tree_map(f, x)
        e = jax.tree_structure(x), jax.tree_flatten(x), jax.tree_unflatten(t, l)
        g = tu.tree_multimap(f, x, y)
        h = jax.tree_util.tree_map(f, x)
        """, """
        import jax
        import jax.tree_util as tu

        a = jax.tree.map(f, x)
        b = jax.tree.map(f, x, y)
        c = jax.tree.leaves(x)
        d = jax.tree.map(f, x)
        e = jax.tree.structure(x), jax.tree.flatten(x), jax.tree.unflatten(t, l)
        g = jax.tree_util.tree_map(f, x, y)
        h = jax.tree_util.tree_map(f, x)
        """, target="jax", pmap_sites=False)

  def test_experimental_target_leaves_them(self):
    source = "import jax\n\na = jax.tree_map(f, x)\n"
    assert rewrite(source, target="experimental")[0] == source


def test_device_put_calls_are_rewritten_and_removed_modules_reported():
  new, findings = rewrite(
      "import jax\nfrom jax.experimental import maps\n\n"
      "r = jax.device_put_replicated(x, jax.local_devices())\n"
      "s = jax.device_put_sharded(shards, devs)\n", target="jax")
  assert "r = device_put_replicated(x, jax.local_devices())" in new
  assert "s = device_put_sharded(shards, devs)" in new
  assert "from pmap_shard_map import device_put_replicated, device_put_sharded" in new
  assert any(f.severity.value == "WARNING" and "jax.experimental.maps is removed" in f.message
             for f in findings), findings
  assert "from jax.experimental import maps" in new  # reported, not rewritten


def _placement(tree):
  return [[(s.device, s.index) for s in leaf.addressable_shards] for leaf in jax.tree.leaves(tree)]


REPLICATED_VALUES = {
    "python_float": lambda: 1.0, "python_int": lambda: 3,
    "numpy_int16": lambda: np.arange(6, dtype=np.int16).reshape(2, 3),
    "numpy_float64": lambda: np.linspace(0, 1, 5), "numpy_bool": lambda: np.array([True, False]),
    "bfloat16": lambda: jnp.arange(4, dtype=jnp.bfloat16),
    "jax_weak": lambda: jnp.asarray(2.5), "jax_strong": lambda: jnp.arange(5.0),
    "key": lambda: jax.random.key(0),
    "tree": lambda: {"w": np.ones((3,), np.float32), "b": (np.float32(2.5), np.arange(4))}}


@pytest.mark.parametrize("name", sorted(REPLICATED_VALUES))
@pytest.mark.parametrize("axis_name", [None, "batch"])
def test_device_put_replicated_replacement_equals_jax(name, axis_name):
  value = REPLICATED_VALUES[name]()
  devices = jax.local_devices()[:4]
  expected = jax.device_put_replicated(value, devices)
  kwargs = {} if axis_name is None else {"axis_name": axis_name}
  ours = support().device_put_replicated(value, devices, **kwargs)
  assert jax.tree.structure(expected) == jax.tree.structure(ours)
  for e, o in zip(jax.tree.leaves(expected), jax.tree.leaves(ours), strict=True):
    assert e.shape == o.shape and e.dtype == o.dtype
    assert getattr(e, "weak_type", None) == getattr(o, "weak_type", None)  # keys have none
    if jax.dtypes.issubdtype(e.dtype, jax.dtypes.prng_key):
      e, o = jax.random.key_data(e), jax.random.key_data(o)
    np.testing.assert_array_equal(np.asarray(e), np.asarray(o))
  assert _placement(expected) == _placement(ours)


def test_device_put_replicated_replacement_compiles_no_more_than_jax():
  """Arrays are stacked on the host: no program per leaf shape (a Flax state has dozens)."""
  values = {"w": np.ones((3, 5), np.float32), "b": jnp.arange(7.0), "n": np.int32(4)}
  devices = jax.local_devices()
  jax.clear_caches()
  with compiles() as theirs:
    jax.block_until_ready(jax.device_put_replicated(values, devices))
  jax.clear_caches()
  with compiles() as ours:
    jax.block_until_ready(support().device_put_replicated(values, devices, axis_name="i"))
  assert sum(ours.values()) <= sum(theirs.values()), (dict(ours), dict(theirs))


def test_device_put_sharded_replacement_equals_jax():
  devices = jax.local_devices()[2:5]
  shards = [{"a": np.full((2,), i, np.float32), "b": np.int32(i)} for i in range(3)]
  expected = jax.device_put_sharded(shards, devices)
  ours = support().device_put_sharded(shards, devices)
  assert jax.tree.structure(expected) == jax.tree.structure(ours)
  for e, o in zip(jax.tree.leaves(expected), jax.tree.leaves(ours), strict=True):
    assert e.shape == o.shape and e.dtype == o.dtype
    np.testing.assert_array_equal(np.asarray(e), np.asarray(o))
  assert _placement(expected) == _placement(ours)
