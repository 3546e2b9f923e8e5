"""Rule: --target picks the shard_map API the sites call; --multihost adds the host-local
<-> global conversion around the jitted site."""
from codemod_testing import SiteTest, rewrite


class TargetTest(SiteTest):

  def test_target_jax_imports_no_experimental_module(self):
    self.assertConverts("""
        import jax

        g = jax.pmap(f, "i")
        """, """
        import jax
        import functools
        from jax.sharding import PartitionSpec as P




        g = jax.jit(on_pmap_mesh(functools.partial(jax.shard_map, in_specs=P("i"), out_specs=P("i"), check_vma=False), drop_device_axis=True)(f))
        """, target="jax")

  def test_multihost_wraps_the_jitted_function(self):
    self.assertConverts("""
        import jax

        g = jax.pmap(f, "i")
        """, """
        import jax
        import functools
        from jax.sharding import PartitionSpec as P
        from jax.experimental.shard_map import shard_map




        from pmap_shard_map import host_local_io, on_pmap_mesh

        g = host_local_io(jax.jit(
            on_pmap_mesh(functools.partial(shard_map, in_specs=P("i"), out_specs=P("i"), check_rep=False), drop_device_axis=True, across_hosts=True)(f)),
            in_specs=P("i"), out_specs=P("i"))
        """, multihost=True)

  def test_multihost_decorator_gets_an_outer_decorator(self):
    self.assertConverts("""
        import jax

        @jax.pmap
        def step(x):
            return x
        """, """
        import jax
        import functools
        from jax.sharding import PartitionSpec as P
        from jax.experimental.shard_map import shard_map




        from pmap_shard_map import host_local_io, on_pmap_mesh

        @functools.partial(host_local_io, in_specs=P("pmap_axis"), out_specs=P("pmap_axis"))
        @jax.jit
        @on_pmap_mesh(functools.partial(shard_map, in_specs=P("pmap_axis"), out_specs=P("pmap_axis"), check_rep=False), drop_device_axis=True, across_hosts=True)
        def step(x):
            return x
        """, multihost=True)

  def test_spec_name_avoids_a_clashing_P(self):
    self.assertConverts("""
        import jax

        P = 3
        g = jax.pmap(f, "i")
        """, """
        import jax
        import functools
        from jax.experimental.shard_map import shard_map

        P = 3




        g = jax.jit(
            on_pmap_mesh(functools.partial(shard_map, in_specs=jax.sharding.PartitionSpec("i"), out_specs=jax.sharding.PartitionSpec("i"), check_rep=False), drop_device_axis=True)(f))
        """)

  def test_existing_partitionspec_import_is_reused(self):
    self.assertConverts("""
        import jax
        from jax.sharding import PartitionSpec as P

        g = jax.pmap(f, "i")
        """, """
        import jax
        from jax.sharding import PartitionSpec as P
        import functools
        from jax.experimental.shard_map import shard_map




        g = jax.jit(on_pmap_mesh(functools.partial(shard_map, in_specs=P("i"), out_specs=P("i"), check_rep=False), drop_device_axis=True)(f))
        """)


def test_output_is_idempotent_for_every_fixture():
  import os
  here = os.path.join(os.path.dirname(__file__), "fixtures")
  for name in sorted(os.listdir(here)):
    with open(os.path.join(here, name), encoding="utf-8") as f:
      source = f.read()
    for options in ({"target": "experimental"}, {"target": "jax"}, {"multihost": True}):
      once, _ = rewrite(source, **options)
      twice, findings = rewrite(once, **options)
      assert twice == once, (name, options)
      assert not [f for f in findings if f.severity.value != "INFO"]
