"""Rule: --target picks the shard_map API the helper calls; --multihost adds the host-local
<-> global conversion; neither changes how the sites themselves read."""
from codemod import runtime
from codemod_testing import PmapCodemodTest, SiteTest, rewrite


class TargetTest(SiteTest):

  def test_target_jax_imports_no_experimental_module(self):
    self.assertConverts("""
        import jax

        g = jax.pmap(f, "i")
        """, """
        import jax
        import functools
        from jax.sharding import PartitionSpec as P


        # <pmap-to-shmap helpers>


        g = jax.jit(_pmap_as_shard_map(f, axes=("i",), in_specs=P("i"), out_specs=P("i")))
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


        # <pmap-to-shmap helpers>


        g = _pmap_host_local_io(jax.jit(
            _pmap_as_shard_map(f, axes=("i",), in_specs=P("i"), out_specs=P("i"))))
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


        # <pmap-to-shmap helpers>


        @_pmap_host_local_io
        @jax.jit
        @functools.partial(
            _pmap_as_shard_map, axes=("pmap_axis",), in_specs=P("pmap_axis"),
            out_specs=P("pmap_axis"))
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


        # <pmap-to-shmap helpers>


        g = jax.jit(
            _pmap_as_shard_map(
                f, axes=("i",), in_specs=jax.sharding.PartitionSpec("i"),
                out_specs=jax.sharding.PartitionSpec("i")))
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


        # <pmap-to-shmap helpers>


        g = jax.jit(_pmap_as_shard_map(f, axes=("i",), in_specs=P("i"), out_specs=P("i")))
        """)


def test_helper_text_differs_only_in_the_shard_map_call():
  exp = runtime.helper_source("experimental").splitlines()
  new = runtime.helper_source("jax").splitlines()
  changed = [(a, b) for a, b in zip(exp, new) if a != b]
  assert len(exp) + 2 == len(new)
  assert any("shard_map(per_device, mesh, specs, out_specs, check_rep=False)" in a
             for a, _ in changed)
  assert "check_vma=False)" in "\n".join(new)


def test_helper_follows_the_file_indentation():
  two = runtime.helper_source("experimental", indent="  ")
  assert "\n  if devices is None:\n    pool = " in two


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
