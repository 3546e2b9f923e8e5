"""Rule: pmap's other options -- static_broadcasted_argnums, donate_argnums, devices,
backend, axis_size -- move to jax.jit or to the mesh; the rest are reported. donate_argnums
(to jax.jit), devices, backend and axis_size (the devices of the site's mesh) and literal
static_broadcasted_argnums (to jax.jit and placed_on) fit the plain form; options known only
at run time keep pmap's own call, on pmap_via_shard_map."""
import numpy as np

from codemod_testing import SiteTest, rewrite, support


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

  def test_star_kwargs_are_reported(self):
    self.assertSiteError('g = jax.pmap(f, **pmap_kwargs)', "passed with * or **")

  def test_unknown_keyword_is_reported(self):
    self.assertSiteError('g = jax.pmap(f, "i", in_axis=0)', "no argument 'in_axis'")

  def test_negative_static_argnum_is_reported(self):
    self.assertSiteError('g = jax.pmap(f, "i", static_broadcasted_argnums=(-1,))',
                         "negative static_broadcasted_argnums")

  def test_too_many_positional_arguments_are_reported(self):
    self.assertSiteError('g = jax.pmap(f, "i", 0)', "more than two positional")
