"""Rule: ``removed_apis.RemovedApisCommand`` rewrites the names newest JAX removed into
what it keeps, on its own as a libcst command, exactly as the pmap rewrite does with
``--target jax`` in the same walk as its sites."""
import textwrap

import jax
import libcst as cst
import numpy as np
import pytest
from libcst.codemod import CodemodContext, CodemodTest

from codemod.removed_apis import RemovedApisCommand
from codemod_testing import rewrite, support


class RemovedApisTest(CodemodTest):
  TRANSFORM = RemovedApisCommand

  def test_tree_family_in_every_import_form(self):
    self.assertCodemod("""
        import jax
        import jax.tree_util as tu
        from jax import tree_map, tree_leaves as leaves

        a = jax.tree_map(f, x)
        b = leaves(tree_map(f, x))
        g = tu.tree_multimap(f, x, y)
        h = jax.tree_util.tree_map(f, x)
        """, """
        import jax
        import jax.tree_util as tu

        a = jax.tree.map(f, x)
        b = jax.tree.leaves(jax.tree.map(f, x))
        g = jax.tree_util.tree_map(f, x, y)
        h = jax.tree_util.tree_map(f, x)
        """, expected_warnings=[
            "5:5 INFO jax.tree_map rewritten to jax.tree.map, which newest JAX keeps",
            "6:5 INFO leaves rewritten to jax.tree.leaves, which newest JAX keeps",
            "6:12 INFO tree_map rewritten to jax.tree.map, which newest JAX keeps",
            "7:5 INFO tu.tree_multimap rewritten to jax.tree_util.tree_map, which newest "
            "JAX keeps"])

  def test_a_device_put_the_file_defines_is_not_hidden_by_the_support_import(self):
    # chex inlined its own device_put_replicated: the import would replace it
    source = """
        import jax


        def device_put_replicated(x, devices):
          return [jax.device_put(x, d) for d in devices]


        r = jax.device_put_replicated(x, jax.local_devices())
        s = device_put_replicated(x, jax.local_devices())
        """
    self.assertCodemod(source, source, expected_warnings=[
        "8:5 WARNING jax.device_put_replicated left as is: the file binds "
        "device_put_replicated, which the support module's replacement would be imported "
        "as; rename it, then rerun"])

  def test_device_put_calls_import_the_support_functions_in_their_group(self):
    self.assertCodemod("""
        import jax
        import numpy as np

        from mypackage import models

        r = jax.device_put_replicated(x, jax.local_devices())
        s = jax.device_put_sharded(shards, devs)
        """, """
        import jax
        import numpy as np

        from mypackage import models
        from pmap_shard_map import device_put_replicated, device_put_sharded

        r = device_put_replicated(x, jax.local_devices())
        s = device_put_sharded(shards, devs)
        """, expected_warnings=[
            "6:5 INFO jax.device_put_replicated (removed in newer JAX) rewritten to "
            "pmap_shard_map.device_put_replicated, which gives the same values, shapes and "
            "per-device placement",
            "7:5 INFO jax.device_put_sharded (removed in newer JAX) rewritten to "
            "pmap_shard_map.device_put_sharded, which gives the same values, shapes and "
            "per-device placement"])

  def test_a_line_the_new_name_lengthens_is_laid_out_again(self):
    self.assertCodemod("""
        import jax


        def f():
          return jax.tree_multimap(lambda a, b: a + b, first_tree_value, second_tree_value_123)
        """, """
        import jax


        def f():
          return jax.tree.map(
              lambda a, b: a + b,
              first_tree_value,
              second_tree_value_123)
        """, expected_warnings=[
            "5:10 INFO jax.tree_multimap rewritten to jax.tree.map, which newest JAX keeps"],
        context_override=CodemodContext(filename=None))

  def test_removed_modules_are_reported_and_pmap_idioms_are_not(self):
    source = """
        import jax
        from jax.experimental import host_callback

        y = jax.tree.map(lambda x: x[0], state)
        """
    self.assertCodemod(source, source, expected_warnings=[
        "2:1 WARNING jax.experimental.host_callback is removed in newer JAX: use "
        "jax.debug.callback / jax.pure_callback"], expected_skip=False)

  def test_support_module_option(self):
    self.assertCodemod("""
        import jax

        r = jax.device_put_replicated(x, devs)
        """, """
        import jax

        from myproject.parallel import device_put_replicated

        r = device_put_replicated(x, devs)
        """, support_module="myproject.parallel", expected_warnings=[
            "3:5 INFO jax.device_put_replicated (removed in newer JAX) rewritten to "
            "myproject.parallel.device_put_replicated, which gives the same values, shapes "
            "and per-device placement"])


SOURCES = {
    "tree_family": """
        import jax
        from jax import tree_map, tree_structure

        a = jax.tree_map(f, x)
        b = tree_structure(tree_map(f, x))
        c = jax.tree_util.tree_multimap(f, x, y)
        """,
    "device_put": """
        import jax
        from jax import device_put_replicated

        r = device_put_replicated(x, jax.local_devices())
        s = jax.device_put_sharded([a, b], jax.local_devices()[:2])
        """,
    "long_line": """
        import jax


        class Model:

          def step(self, tree):
            return jax.tree_multimap(lambda a, b: a + b, self.first_tree_value, self.second)
        """,
}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_alone_as_in_the_pmap_rewrite(name):
  source = textwrap.dedent(SOURCES[name])
  alone = RemovedApisCommand(CodemodContext()).transform_module(cst.parse_module(source)).code
  assert alone != source
  assert alone == rewrite(source, target="jax")[0]


def test_rewritten_device_put_replicated_gives_jaxs_values_and_placement():
  source = textwrap.dedent(SOURCES["device_put"])
  new = RemovedApisCommand(CodemodContext()).transform_module(cst.parse_module(source)).code
  x, a, b = np.arange(6.0).reshape(2, 3), np.ones(3), np.zeros(3)
  expected = {"r": jax.device_put_replicated(x, jax.local_devices()),
              "s": jax.device_put_sharded([a, b], jax.local_devices()[:2])}
  support()  # importable by the name the new code imports
  namespace = {"x": x, "a": a, "b": b}
  exec(compile(new, "<new>", "exec"), namespace)
  for key, want in expected.items():
    got = namespace[key]
    np.testing.assert_array_equal(got, want)
    assert [s.device for s in got.addressable_shards] == [
        s.device for s in want.addressable_shards]
