"""Rule: --target picks the shard_map API the sites call. Every converted site takes
host-local arrays in every process, as pmap did: placed_on in the plain form, host_local_io
around the old on_pmap_mesh form; --multihost is accepted and changes nothing."""
from codemod_testing import SiteTest, rewrite


class TargetTest(SiteTest):

  def test_target_jax_imports_no_experimental_module(self):
    self.assertConverts("""
        import jax

        g = jax.pmap(f, "i")
        """, """
        import jax
        from jax.sharding import PartitionSpec as P

        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, P("i"))(jax.jit(jax.shard_map(
            per_device(f), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False)))
        """, target="jax")

  def test_multihost_changes_nothing_for_a_plain_site(self):
    # placed_on puts each process's host-local rows on the mesh of every device: the
    # plain form is multi-host correct, and --multihost is accepted for old command lines.
    for source in ('import jax\n\ng = jax.pmap(f, "i")\n',
                   "import jax\n\n@jax.pmap\ndef step(x):\n    return x\n"):
      plain, _ = rewrite(source)
      multihost, _ = rewrite(source, multihost=True)
      self.assertEqual(multihost, plain)
      self.assertIn("placed_on(mesh, P(", plain)
      self.assertNotIn("host_local_io", plain)

  def test_nested_call_site_is_wrapped_in_host_local_io(self):
    self.assertConverts("""
        import jax

        g = jax.pmap(jax.pmap(f, "j"), "i")
        """, """
        import jax
        import functools
        from jax.sharding import PartitionSpec as P
        from jax.experimental.shard_map import shard_map
        from pmap_shard_map import host_local_io, on_pmap_mesh

        g = host_local_io(
            jax.jit(on_pmap_mesh(functools.partial(shard_map, in_specs=P("i", "j"),
                                                   out_specs=P("i", "j"), check_rep=False),
                                 drop_device_axis=True, axes=("i", "j"),
                                 across_hosts=True)(f)),
            in_specs=P("i", "j"), out_specs=P("i", "j"), axes=("i", "j"))
        """)

  def test_run_time_axes_decorator_becomes_a_pmap_via_shard_map_decorator(self):
    self.assertConverts("""
        import functools
        import jax

        AXES = (0, None)

        @functools.partial(jax.pmap, in_axes=AXES)
        def step(x, n):
            return x
        """, """
        import functools

        from pmap_shard_map import pmap_via_shard_map

        AXES = (0, None)

        @functools.partial(pmap_via_shard_map, in_axes=AXES)
        def step(x, n):
            return x
        """)

  def test_spec_name_avoids_a_clashing_P(self):
    self.assertConverts("""
        import jax

        P = 3
        g = jax.pmap(f, "i")
        """, """
        import jax
        from jax.experimental.shard_map import shard_map

        P = 3
        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, jax.sharding.PartitionSpec("i"))(jax.jit(shard_map(
            per_device(f), mesh=mesh, in_specs=jax.sharding.PartitionSpec("i"), out_specs=jax.sharding.PartitionSpec("i"), check_rep=False)))
        """)

  def test_existing_partitionspec_import_is_reused(self):
    self.assertConverts("""
        import jax
        from jax.sharding import PartitionSpec as P

        g = jax.pmap(f, "i")
        """, """
        import jax
        from jax.sharding import PartitionSpec as P
        from jax.experimental.shard_map import shard_map

        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, P("i"))(jax.jit(shard_map(
            per_device(f), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))
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
