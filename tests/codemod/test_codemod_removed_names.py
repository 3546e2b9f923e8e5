"""Rule: with --target jax, names newest JAX removed are rewritten to what it keeps (the
jax.tree_map family -> jax.tree.* / jax.tree_util.*; device_put_replicated / _sharded
-> the support module's exact equivalents) or reported; --target experimental (older
JAX, where they still exist) leaves them alone."""
import jax
import numpy as np
import pytest

from codemod_testing import PmapCodemodTest, rewrite, support


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


@pytest.mark.parametrize("value", [
    1.0, np.arange(6, dtype=np.int16).reshape(2, 3),
    {"w": np.ones((3,), np.float32), "b": (np.float32(2.5), np.arange(4))}])
def test_device_put_replicated_replacement_equals_jax(value):
  devices = jax.local_devices()[:4]
  expected = jax.device_put_replicated(value, devices)
  ours = support().device_put_replicated(value, devices)
  assert jax.tree.structure(expected) == jax.tree.structure(ours)
  for e, o in zip(jax.tree.leaves(expected), jax.tree.leaves(ours), strict=True):
    assert e.shape == o.shape and e.dtype == o.dtype and e.weak_type == o.weak_type
    np.testing.assert_array_equal(np.asarray(e), np.asarray(o))
  assert _placement(expected) == _placement(ours)


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
