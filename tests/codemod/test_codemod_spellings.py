"""Rule: pmap sites are found by meaning, whatever the spelling; other `pmap`s are untouched."""
from codemod_testing import PmapCodemodTest


class SpellingTest(PmapCodemodTest):

  def test_attribute_on_jax(self):
    self.assertConverts("""
        import jax

        g = jax.pmap(f)
        """, """
        import jax
        from jax.sharding import PartitionSpec as P
        from jax.experimental.shard_map import shard_map

        mesh = jax.sharding.Mesh(jax.devices(), ("devices",))
        g = placed_on(mesh, P("devices"))(jax.jit(shard_map(
            per_device(f), mesh=mesh, in_specs=P("devices"), out_specs=P("devices"), check_rep=False)))
        """)

  def test_from_import_is_removed(self):
    self.assertConverts("""
        from jax import pmap

        g = pmap(f, "i")
        """, """
        import jax
        from jax.sharding import PartitionSpec as P
        from jax.experimental.shard_map import shard_map

        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, P("i"))(jax.jit(shard_map(
            per_device(f), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))
        """)

  def test_from_import_with_alias(self):
    self.assertConverts("""
        import jax
        from jax import pmap as p

        g = p(f, "i")
        """, """
        import jax
        from jax.sharding import PartitionSpec as P
        from jax.experimental.shard_map import shard_map

        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, P("i"))(jax.jit(shard_map(
            per_device(f), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))
        """)

  def test_module_alias(self):
    self.assertConverts("""
        import jax as jx

        g = jx.pmap(f, "i")
        """, """
        import jax
        from jax.sharding import PartitionSpec as P
        from jax.experimental.shard_map import shard_map

        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, P("i"))(jax.jit(shard_map(
            per_device(f), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))
        """)

  def test_jax_api_path(self):
    self.assertConverts("""
        import jax
        from jax import api

        g = api.pmap(f, "i")
        """, """
        import jax
        from jax import api
        from jax.sharding import PartitionSpec as P
        from jax.experimental.shard_map import shard_map

        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, P("i"))(jax.jit(shard_map(
            per_device(f), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))
        """)

  def test_own_function_named_pmap_is_untouched(self):
    self.assertUnchanged("""
        import jax

        def pmap(f, axis_name=None):
            return f

        g = pmap(f, "i")
        """)

  def test_method_named_pmap_is_untouched(self):
    self.assertUnchanged("""
        import jax

        class Runner:
            def pmap(self, f):
                return f

            def go(self, f):
                return self.pmap(f)
        """)

  def test_other_library_pmap_is_untouched(self):
    self.assertUnchanged("""
        import functorch
        from mylib import pmap

        a = functorch.pmap(f)
        b = pmap(f, "i")
        """)

  def test_local_parameter_shadowing_pmap_is_untouched(self):
    self.assertUnchanged("""
        from jax import pmap

        def build(pmap, f):
            return pmap(f)
        """)

  def test_string_and_comment_mentions_are_untouched(self):
    self.assertUnchanged("""
        import jax

        # jax.pmap(f) is what we used to do
        doc = "jax.pmap(f, axis_name='i')"
        """)
