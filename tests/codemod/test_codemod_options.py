"""Rule: pmap's other options -- static_broadcasted_argnums, donate_argnums, devices,
backend, axis_size -- move to jax.jit or to the mesh; the rest are reported. donate_argnums
(to jax.jit), devices, backend and axis_size (the devices of the site's mesh) and literal
static_broadcasted_argnums (to jax.jit and placed_on) fit the plain form; options known only
at run time keep pmap's own call, on pmap_via_shard_map."""
import textwrap

import jax
import numpy as np

from codemod_testing import SiteTest, load, rewrite, support


class OptionsTest(SiteTest):

  def test_static_argnums_go_to_jit_and_the_helper(self):
    self.assertSite('g = jax.pmap(f, "i", static_broadcasted_argnums=(2,))', '''
        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, P("i"), static_argnums=(2,))(
            jax.jit(shard_map(per_device(f), mesh=mesh, in_specs=P("i"),
                              out_specs=P("i"), check_rep=False),
                    static_argnums=(2,)))''')

  def test_donate_argnums_go_to_jit(self):
    self.assertSite('g = jax.pmap(f, "i", donate_argnums=(0, 1))', '''
        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, P("i"))(jax.jit(shard_map(
            per_device(f), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False), donate_argnums=(0, 1)))''')

  def test_static_and_donate_together(self):
    self.assertSite('g = jax.pmap(f, "i", static_broadcasted_argnums=1, donate_argnums=0)', '''
        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, P("i"), static_argnums=(1,))(
            jax.jit(shard_map(per_device(f), mesh=mesh, in_specs=P("i"),
                              out_specs=P("i"), check_rep=False),
                    static_argnums=1, donate_argnums=0))''')

  def test_devices_go_to_the_mesh(self):
    self.assertSite('g = jax.pmap(f, "i", devices=jax.devices()[:4])', '''
        mesh = jax.sharding.Mesh(jax.devices()[:4], ("i",))
        g = placed_on(mesh, P("i"))(jax.jit(shard_map(per_device(f), mesh=mesh,
                                                      in_specs=P("i"), out_specs=P("i"),
                                                      check_rep=False)))''')

  def test_backend_goes_to_the_mesh(self):
    self.assertSite('g = jax.pmap(f, "i", backend="cpu")', '''
        mesh = jax.sharding.Mesh(jax.devices("cpu"), ("i",))
        g = placed_on(mesh, P("i"))(jax.jit(shard_map(per_device(f), mesh=mesh,
                                                      in_specs=P("i"), out_specs=P("i"),
                                                      check_rep=False)))''')

  def test_backend_and_axis_size(self):
    self.assertSite('g = jax.pmap(f, "i", axis_size=4, backend="cpu")', '''
        mesh = jax.sharding.Mesh(jax.devices("cpu")[:4], ("i",))
        g = placed_on(mesh, P("i"))(jax.jit(shard_map(per_device(f), mesh=mesh,
                                                      in_specs=P("i"), out_specs=P("i"),
                                                      check_rep=False)))''')

  def test_axis_size_with_devices_goes_to_pmap_via_shard_map(self):
    # pmap checked the two against each other when called: pmap's own call, on the
    # support function with its signature.
    self.assertConverts("""
        import jax

        g = jax.pmap(f, "i", axis_size=4, devices=jax.devices()[:4])
        """, """
        import jax

        from pmap_shard_map import pmap_via_shard_map

        g = pmap_via_shard_map(f, "i", axis_size=4, devices=jax.devices()[:4])
        """)

  def test_explicit_none_axis_name_gets_the_default(self):
    self.assertSite('g = jax.pmap(f, axis_name=None, out_axes=None)', '''
        mesh = jax.sharding.Mesh(jax.devices(), ("devices",))
        g = placed_on(mesh, P("devices"))(jax.jit(shard_map(
            per_device(f, out_axes=None), mesh=mesh, in_specs=P("devices"), out_specs=P(), check_rep=False)))''')

  def test_global_arg_shapes_is_reported(self):
    self.assertSiteError('g = jax.pmap(f, "i", global_arg_shapes=((8,),))', "global_arg_shapes")

  def test_global_arg_shapes_none_is_the_default(self):
    self.assertSite('g = jax.pmap(f, "i", global_arg_shapes=None)', '''
        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, P("i"))(jax.jit(shard_map(
            per_device(f), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))''')
    _, findings = rewrite('import jax\ng = jax.pmap(f, "i", global_arg_shapes=None)\n')
    self.assertEqual([f.severity.value for f in findings], ["INFO"], findings)

  def test_forwarded_global_arg_shapes_is_dropped_with_a_warning(self):
    # A wrapper passing its own parameter through (flax's nnx.pmap): None unless its caller
    # set it, when legacy pmap raised.
    self.assertSite('g = jax.pmap(f, "i", global_arg_shapes=global_arg_shapes)', '''
        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        g = placed_on(mesh, P("i"))(jax.jit(shard_map(
            per_device(f), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))''')
    _, findings = rewrite(
        'import jax\ng = jax.pmap(f, "i", global_arg_shapes=global_arg_shapes)\n')
    warnings = [f.message for f in findings if f.severity.value == "WARNING"]
    self.assertEqual(len(warnings), 1, findings)
    self.assertIn("global_arg_shapes=global_arg_shapes dropped", warnings[0])

  def test_forwarded_global_arg_shapes_goes_with_pmaps_own_call(self):
    # pmap_via_shard_map takes it as legacy pmap did (None passes, anything else raises).
    source = 'import jax\ng = jax.pmap(f, "i", in_axes=axes, global_arg_shapes=shapes)\n'
    new, findings = rewrite(source)
    self.assertIn('g = pmap_via_shard_map(f, "i", in_axes=axes, global_arg_shapes=shapes)', new)
    self.assertEqual([f.severity.value for f in findings], ["INFO"], findings)
    support_functions = support()
    self.assertEqual(support_functions.pmap_via_shard_map(
        lambda x: x, global_arg_shapes=None)(np.ones(1)).tolist(), [1.0])
    with self.assertRaisesRegex(ValueError, "global_arg_shapes is not supported"):
      support_functions.pmap_via_shard_map(lambda x: x, global_arg_shapes=((1,),))

  def test_star_arguments_keep_pmaps_own_call(self):
    # Which options they set is known only at run time: pmap_via_shard_map, which takes
    # pmap's arguments, reads them there; the call is left as written but for pmap's name.
    for call in ("jax.pmap(f, **pmap_kwargs)", "jax.pmap(f, *args)",
                 "jax.pmap(*args, donate_argnums=0)"):
      with self.subTest(call):
        self.assertConverts(f"""
            import jax

            g = {call}
            """, f"""
            from pmap_shard_map import pmap_via_shard_map

            g = {call.replace("jax.pmap", "pmap_via_shard_map")}
            """)
    self.assertConverts("""
        import functools

        import jax

        @functools.partial(jax.pmap, **options)
        def g(x):
          return x
        """, """
        import functools

        from pmap_shard_map import pmap_via_shard_map

        @functools.partial(pmap_via_shard_map, **options)
        def g(x):
          return x
        """)

  def test_star_arguments_give_legacy_results(self):
    source = """
        import jax
        import numpy as np

        def reduce(x):
          return jax.lax.psum(x, "i") * x, jax.lax.axis_index("i")

        options = dict(axis_name="i", in_axes=(0,), out_axes=(0, None))
        g = jax.pmap(reduce, **options)
        h = jax.pmap(reduce, *["i"])
        x = np.linspace(-1, 1, jax.device_count() * 3, dtype=np.float32).reshape(-1, 3)
        out = g(x), h(x)
        """
    new, _ = rewrite(source)
    self.assertIn("g = pmap_via_shard_map(reduce, **options)", new)
    self.assertIn('h = pmap_via_shard_map(reduce, *["i"])', new)
    legacy = load(textwrap.dedent(source), "star_legacy").out
    converted = load(new, "star_converted").out
    for theirs, ours in zip(jax.tree.leaves(legacy), jax.tree.leaves(converted), strict=True):
      self.assertEqual(np.asarray(theirs).tobytes(), np.asarray(ours).tobytes())
      self.assertEqual(np.shape(theirs), np.shape(ours))

  def test_nested_pmaps_with_star_arguments_are_reported(self):
    self.assertSiteError('g = jax.pmap(jax.pmap(f, "j"), **pmap_kwargs)', "passed with * or **")

  def test_star_arguments_where_the_new_name_overflows_the_line_are_reported(self):
    self.assertSiteError(
        "g = jax.pmap(a_function_with_a_very_long_name_indeed_for_this_line, **kwargs)",
        "over 80 columns")

  def test_unknown_keyword_is_reported(self):
    self.assertSiteError('g = jax.pmap(f, "i", in_axis=0)', "no argument 'in_axis'")

  def test_negative_static_argnum_is_reported(self):
    self.assertSiteError('g = jax.pmap(f, "i", static_broadcasted_argnums=(-1,))',
                         "negative static_broadcasted_argnums")

  def test_too_many_positional_arguments_are_reported(self):
    self.assertSiteError('g = jax.pmap(f, "i", 0)', "more than two positional")
