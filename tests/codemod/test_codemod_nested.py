"""Rule: directly nested pmaps become one shard_map over a multi-axis mesh (the old
``host_local_io(jax.jit(on_pmap_mesh(...)))`` form, which builds that mesh on the first
call); nesting that is not statically clear is reported and left unchanged."""
import textwrap

from codemod_testing import PmapCodemodTest, SiteTest, rewrite


class NestedTest(SiteTest):

  def test_pmap_of_pmap(self):
    self.assertSite('g = jax.pmap(jax.pmap(f, "j"), "i")', '''
        g = host_local_io(
            jax.jit(on_pmap_mesh(functools.partial(shard_map, in_specs=P("i", "j"), out_specs=P("i", "j"), check_rep=False), drop_device_axis=True, axes=("i", "j"), across_hosts=True)(f)),
            in_specs=P("i", "j"), out_specs=P("i", "j"), axes=("i", "j"))''')

  def test_inner_axes_are_placed_in_the_original_array(self):
    # outer maps axis 1; inner maps axis 1 of what is left, i.e. axis 2 of the original.
    self.assertSite('g = jax.pmap(jax.pmap(f, "j", in_axes=1), "i", in_axes=1)', '''
        g = host_local_io(
            jax.jit(on_pmap_mesh(functools.partial(shard_map, in_specs=P(None, "i", "j"), out_specs=P("i", "j"), check_rep=False), drop_device_axis=True, axes=("i", "j"), across_hosts=True)(f)),
            in_specs=P(None, "i", "j"), out_specs=P("i", "j"), axes=("i", "j"))''')

  def test_inner_axis_before_outer_axis(self):
    self.assertSite('g = jax.pmap(jax.pmap(f, "j", in_axes=0, out_axes=1), "i", in_axes=1)', '''
        g = host_local_io(
            jax.jit(on_pmap_mesh(functools.partial(shard_map, in_specs=P("j", "i"), out_specs=P("i", None, "j"), check_rep=False), drop_device_axis=True, axes=("i", "j"), across_hosts=True)(f)),
            in_specs=P("j", "i"), out_specs=P("i", None, "j"), axes=("i", "j"))''')

  def test_per_argument_axes_with_none(self):
    self.assertSite('g = jax.pmap(jax.pmap(f, "m", in_axes=(0, None)), "d", in_axes=(0, 0), out_axes=None)', '''
        g = host_local_io(
            jax.jit(on_pmap_mesh(functools.partial(shard_map, in_specs=(P("d", "m"), P("d")), out_specs=P("m"), check_rep=False), drop_device_axis=True, axes=("d", "m"), across_hosts=True)(f)),
            in_specs=(P("d", "m"), P("d")), out_specs=P("m"), axes=("d", "m"))''')

  def test_unnamed_levels_get_distinct_default_names(self):
    self.assertSite('g = jax.pmap(jax.pmap(f))', '''
        g = host_local_io(
            jax.jit(on_pmap_mesh(functools.partial(shard_map, in_specs=P("devices", "devices_1"), out_specs=P("devices", "devices_1"), check_rep=False), drop_device_axis=True, axes=("devices", "devices_1"), across_hosts=True)(f)),
            in_specs=P("devices", "devices_1"), out_specs=P("devices", "devices_1"), axes=("devices", "devices_1"))''')

  def test_same_axis_name_twice_is_reported(self):
    self.assertSiteError('g = jax.pmap(jax.pmap(f, "i"), "i")', "share an axis name")

  def test_inner_static_argnums_are_reported(self):
    self.assertSiteError('g = jax.pmap(jax.pmap(f, "j", static_broadcasted_argnums=1), "i")',
                         "inner of nested pmaps sets static_broadcasted_argnums")

  def test_mismatched_structures_are_reported(self):
    self.assertSiteError('g = jax.pmap(jax.pmap(f, "j", in_axes=(0, 0)), "i", in_axes=(0, 0, 0))',
                         "different structures")


class NestedDecoratorsTest(PmapCodemodTest):

  def test_stacked_decorators(self):
    self.assertConverts("""
        import functools
        import jax

        @functools.partial(jax.pmap, axis_name="i")
        @functools.partial(jax.pmap, axis_name="j")
        def step(x):
            return jax.lax.psum(x, ("i", "j"))
        """, """
        import functools
        import jax
        from jax.sharding import PartitionSpec as P
        from jax.experimental.shard_map import shard_map

        @functools.partial(host_local_io, in_specs=P("i", "j"), out_specs=P("i", "j"), axes=("i", "j"))
        @jax.jit
        @on_pmap_mesh(functools.partial(shard_map, in_specs=P("i", "j"), out_specs=P("i", "j"), check_rep=False), drop_device_axis=True, axes=("i", "j"), across_hosts=True)
        def step(x):
            return jax.lax.psum(x, ("i", "j"))
        """)

  def test_pmap_inside_a_pmapped_body_is_reported(self):
    before = textwrap.dedent("""
        import jax

        def outer(x):
            return jax.pmap(inner, "j")(x)

        g = jax.pmap(outer, "i")
        """)
    self.assertUnchanged(before)
    _, findings = rewrite(before)
    errors = [f for f in findings if f.severity.value == "ERROR"]
    self.assertEqual(len(errors), 2, findings)
    self.assertTrue(all("inside the body of a pmapped function" in f.message for f in errors))

  def test_pmap_inside_a_decorated_body_is_reported(self):
    self.assertUnchanged("""
        import jax

        @jax.pmap
        def outer(x):
            return jax.pmap(lambda y: y)(x)
        """)

  def test_a_builtin_pmapped_is_no_body_to_look_into(self):
    # Looking for pmaps inside the mapped function's body found abs's builtin binding,
    # which has no node, and crashed.
    new, findings = rewrite("import jax\n\n\ndef f(x):\n  return jax.pmap(abs)(x)\n")
    self.assertNotIn("jax.pmap(", new)
    self.assertFalse([f for f in findings if f.severity.value == "ERROR"], findings)
