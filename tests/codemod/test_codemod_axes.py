"""Rule: in_axes / out_axes become in_specs / out_specs, leaf by leaf; what cannot be derived
statically is reported and left unchanged."""
import textwrap

from codemod_testing import SiteTest, rewrite


class InAxesTest(SiteTest):

  def test_default_maps_everything_on_axis_0(self):
    self.assertSite('g = jax.pmap(f, "i")', '''
        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, P("i"))(jax.jit(shard_map(
            per_device(f), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))''')

  def test_int_axis_puts_nones_before_the_name(self):
    self.assertSite('g = jax.pmap(f, "i", in_axes=2)', '''
        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, P(None, None, "i"))(jax.jit(shard_map(
            per_device(f, in_axes=2), mesh=mesh, in_specs=P(None, None, "i"), out_specs=P("i"), check_rep=False)))''')

  def test_tuple_with_none(self):
    self.assertSite('g = jax.pmap(f, "i", in_axes=(0, None, 1))', '''
        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, (P("i"), P(), P(None, "i")))(jax.jit(shard_map(
            per_device(f, in_axes=(0, None, 1)), mesh=mesh, in_specs=(P("i"), P(), P(None, "i")), out_specs=P("i"), check_rep=False)))''')

  def test_single_element_tuple_stays_a_tuple(self):
    self.assertSite('g = jax.pmap(f, "i", in_axes=(1,))', '''
        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, (P(None, "i"),))(jax.jit(shard_map(
            per_device(f, in_axes=(1,)), mesh=mesh, in_specs=(P(None, "i"),), out_specs=P("i"), check_rep=False)))''')

  def test_top_level_list_is_the_argument_tuple(self):
    self.assertSite('g = jax.pmap(f, "i", in_axes=[0, None])', '''
        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, (P("i"), P()))(jax.jit(shard_map(
            per_device(f, in_axes=[0, None]), mesh=mesh, in_specs=(P("i"), P()), out_specs=P("i"), check_rep=False)))''')

  def test_dict_pytree_element_by_element(self):
    self.assertSite('g = jax.pmap(f, "i", in_axes=({"w": 0, "b": None}, 1))', '''
        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, ({"w": P("i"), "b": P()}, P(None, "i")))(jax.jit(shard_map(
            per_device(f, in_axes=({"w": 0, "b": None}, 1)), mesh=mesh, in_specs=({"w": P("i"), "b": P()}, P(None, "i")), out_specs=P("i"), check_rep=False)))''')

  def test_nested_tuple_pytree(self):
    self.assertSite('g = jax.pmap(f, "i", in_axes=((0, None), 0))', '''
        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, ((P("i"), P()), P("i")))(jax.jit(shard_map(
            per_device(f, in_axes=((0, None), 0)), mesh=mesh, in_specs=((P("i"), P()), P("i")), out_specs=P("i"), check_rep=False)))''')

  def test_axis_name_given_as_a_constant(self):
    self.assertSite('g = jax.pmap(f, axis_name=AXIS, in_axes=(0, None))', '''
        mesh = jax.sharding.Mesh(jax.devices(), (AXIS,))
        g = placed_on(mesh, (P(AXIS), P()))(jax.jit(shard_map(
            per_device(f, in_axes=(0, None)), mesh=mesh, in_specs=(P(AXIS), P()), out_specs=P(AXIS), check_rep=False)))''')

  def test_negative_axis_is_reported(self):
    self.assertSiteError('g = jax.pmap(f, "i", in_axes=-1)', "negative in_axes -1")

  def test_negative_axis_inside_tuple_is_reported(self):
    self.assertSiteError('g = jax.pmap(f, "i", in_axes=(0, -2))', "negative in_axes -2")

  def test_non_literal_axes_go_to_pmap_via_shard_map(self):
    # pmap's own call, renamed to the support function with pmap's signature (which
    # reads the axes when it runs); `import jax` served jax.pmap alone.
    self.assertConverts("""
        import jax

        g = jax.pmap(f, "i", in_axes=my_axes)
        """, """
        from pmap_shard_map import pmap_via_shard_map

        g = pmap_via_shard_map(f, "i", in_axes=my_axes)
        """)

  def test_computed_out_axes_go_to_pmap_via_shard_map(self):
    source = 'import jax\n\ng = jax.pmap(f, "i", out_axes=(0,) * 3)\n'
    new, findings = rewrite(source)
    assert 'g = pmap_via_shard_map(f, "i", out_axes=(0,) * 3)' in new
    assert "from pmap_shard_map import pmap_via_shard_map" in new
    assert [f.severity.value for f in findings] == ["INFO"]

  def test_only_the_name_changes_where_the_line_allows(self):
    # The call keeps its layout (a 4-space hang in a 2-space file) and its comments; a
    # decorator's partial(jax.pmap, ...) too; a line the new name would take past the
    # limit is laid out again.
    source = textwrap.dedent("""\
        import functools

        import jax


        def build(f, in_axes, name):
          g = jax.pmap(
              f,
              axis_name=name,  # the caller's axis
              in_axes=in_axes,
          )
          return g


        @functools.partial(jax.pmap, axis_name="i", in_axes=AXES)
        def h(x):
          return x


        long_name_for_the_site_so_that_renaming_passes_the_limit = jax.pmap(f, "i", in_axes=ax)
        """)
    new, _ = rewrite(source)
    renamed = source.replace("jax.pmap", "pmap_via_shard_map").replace(
        "import jax\n", "from pmap_shard_map import pmap_via_shard_map\n")
    kept, _, last = renamed.rpartition("\n\n\n")
    assert new.startswith(kept), new
    assert new.endswith("long_name_for_the_site_so_that_renaming_passes_the_limit = "
                        "pmap_via_shard_map(\n    f, axis_name=\"i\", in_axes=ax)\n"), new

  def test_non_literal_axes_in_nested_pmaps_are_reported(self):
    self.assertSiteError('g = jax.pmap(jax.pmap(f, "j", in_axes=ax), "i")', "in_axes=ax is not a literal")


class OutAxesTest(SiteTest):

  def test_none_is_replicated(self):
    self.assertSite('g = jax.pmap(f, "i", out_axes=None)', '''
        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, P("i"))(jax.jit(shard_map(
            per_device(f, out_axes=None), mesh=mesh, in_specs=P("i"), out_specs=P(), check_rep=False)))''')

  def test_nonzero_axis(self):
    self.assertSite('g = jax.pmap(f, "i", out_axes=1)', '''
        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, P("i"))(jax.jit(shard_map(
            per_device(f, out_axes=1), mesh=mesh, in_specs=P("i"), out_specs=P(None, "i"), check_rep=False)))''')

  def test_pytree_of_axes(self):
    self.assertSite('g = jax.pmap(f, "i", out_axes=(0, None, {"m": 1}))', '''
        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, P("i"))(jax.jit(shard_map(
            per_device(f, out_axes=(0, None, {"m": 1})), mesh=mesh, in_specs=P("i"), out_specs=(P("i"), P(), {"m": P(None, "i")}), check_rep=False)))''')

  def test_negative_out_axis_is_reported(self):
    self.assertSiteError('g = jax.pmap(f, "i", out_axes=-1)', "negative out_axes -1")
