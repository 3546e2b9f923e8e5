"""Rule: every form of pmap site -- decorators, partial, calls on any kind of function, in
any position -- becomes placed_on(mesh, ...) over jax.jit over shard_map over per_device
with the same arguments, on a mesh the file builds before the site's statement."""
import textwrap

from codemod_testing import PmapCodemodTest, rewrite

TOP = """
import jax
import functools
from jax.sharding import PartitionSpec as P
from jax.experimental.shard_map import shard_map
"""
CALL_TOP = """
import jax
from jax.sharding import PartitionSpec as P
from jax.experimental.shard_map import shard_map
"""
MESH = 'mesh = jax.sharding.Mesh(jax.devices(), ("i",))\n'


def top(rest: str) -> str:
  return TOP + textwrap.dedent(rest)


class DecoratorFormsTest(PmapCodemodTest):

  def test_bare_decorator(self):
    self.assertConverts("""
        import jax

        @jax.pmap
        def step(x):
            return x * 2
        """, top("""
        mesh = jax.sharding.Mesh(jax.devices(), ("devices",))

        @placed_on(mesh, P("devices"))
        @jax.jit
        @functools.partial(shard_map, mesh=mesh, in_specs=P("devices"), out_specs=P("devices"), check_rep=False)
        @per_device
        def step(x):
            return x * 2
        """))

  def test_functools_partial_decorator(self):
    self.assertConverts("""
        import functools
        import jax

        @functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0,))
        def step(params, x):
            return params
        """, """
        import functools
        import jax
        from jax.sharding import PartitionSpec as P
        from jax.experimental.shard_map import shard_map

        mesh = jax.sharding.Mesh(jax.devices(), ("batch",))

        @placed_on(mesh, P("batch"))
        @functools.partial(jax.jit, donate_argnums=(0,))
        @functools.partial(shard_map, mesh=mesh, in_specs=P("batch"), out_specs=P("batch"), check_rep=False)
        @per_device
        def step(params, x):
            return params
        """)

  def test_imported_partial_decorator_keeps_its_spelling(self):
    self.assertConverts("""
        from functools import partial
        import jax

        @partial(jax.pmap, axis_name="i")
        def step(x):
            return x
        """, """
        from functools import partial
        import jax
        from jax.sharding import PartitionSpec as P
        from jax.experimental.shard_map import shard_map

        mesh = jax.sharding.Mesh(jax.devices(), ("i",))

        @placed_on(mesh, P("i"))
        @jax.jit
        @partial(shard_map, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)
        @per_device
        def step(x):
            return x
        """)

  def test_decorator_among_others_keeps_their_order_and_comments(self):
    self.assertConverts("""
        import jax

        @trace
        # the step
        @jax.pmap
        @jax.checkpoint
        def step(x):
            return x
        """, top("""
        mesh = jax.sharding.Mesh(jax.devices(), ("devices",))

        @trace
        # the step
        @placed_on(mesh, P("devices"))
        @jax.jit
        @functools.partial(shard_map, mesh=mesh, in_specs=P("devices"), out_specs=P("devices"), check_rep=False)
        @per_device
        @jax.checkpoint
        def step(x):
            return x
        """))

  def test_method_decorator(self):
    self.assertConverts("""
        import jax

        class Model:
            @jax.pmap
            def apply(x):
                return x
        """, top("""
        # A class body is passed over: the mesh is built in the module.
        mesh = jax.sharding.Mesh(jax.devices(), ("devices",))

        class Model:
            @placed_on(mesh, P("devices"))
            @jax.jit
            @functools.partial(shard_map, mesh=mesh, in_specs=P("devices"), out_specs=P("devices"), check_rep=False)
            @per_device
            def apply(x):
                return x
        """))

  def test_decorator_call_without_function_is_reported(self):
    self.assertUnchanged("""
        import jax

        @jax.pmap(axis_name="i")
        def step(x):
            return x
        """)


class CallFormsTest(PmapCodemodTest):

  def _one(self, before_expr: str, after_expr: str, prelude: str = "") -> None:
    self.assertConverts("import jax\n" + prelude + "\n" + before_expr + "\n",
                        CALL_TOP + prelude + "\n" + MESH + after_expr + "\n")

  def test_name(self):
    self._one('g = jax.pmap(f, "i")',
              'g = placed_on(mesh, P("i"))(jax.jit(shard_map(per_device(f), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))')

  def test_attribute_function(self):
    self._one('g = jax.pmap(model.apply, "i")',
              'g = placed_on(mesh, P("i"))(jax.jit(shard_map(per_device(model.apply), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))')

  def test_lambda(self):
    self._one('g = jax.pmap(lambda x: x + 1, "i")',
              'g = placed_on(mesh, P("i"))(jax.jit(shard_map(per_device(lambda x: x + 1), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))')

  def test_partial_function(self):
    self._one('g = jax.pmap(functools.partial(f, k=2), "i")',
              'g = placed_on(mesh, P("i"))(jax.jit(shard_map(per_device(functools.partial(f, k=2)), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))',
              prelude="import functools\n")

  def test_call_expression_function(self):
    self._one('g = jax.pmap(make_step(config), "i")',
              'g = placed_on(mesh, P("i"))(jax.jit(shard_map(per_device(make_step(config)), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))')

  def test_fun_keyword(self):
    self._one('g = jax.pmap(fun=f, axis_name="i")',
              'g = placed_on(mesh, P("i"))(jax.jit(shard_map(per_device(f), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))')

  def test_invoked_immediately(self):
    self._one('y = jax.pmap(f, "i")(make(x))',
              'y = placed_on(mesh, P("i"))(jax.jit(shard_map(per_device(f), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))(make(x))')

  def test_invoked_immediately_on_names_maps_the_devices_pmap_chose(self):
    self.assertConverts(
        'import jax\n\ny = jax.pmap(f, "i")(x)\n',
        CALL_TOP + '\nmesh = jax.sharding.Mesh(pmap_devices(x), ("i",))\n'
        'y = placed_on(mesh, P("i"))(jax.jit(shard_map(per_device(f), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))(x)\n')

  def test_passed_on(self):
    self._one('run(jax.pmap(f, "i"), data)',
              'run(placed_on(mesh, P("i"))(jax.jit(shard_map(per_device(f), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False))), data)')

  def test_partial_then_called(self):
    # The site read functools last: its import goes.
    self.assertConverts(
        'import functools\nimport jax\n\ng = functools.partial(jax.pmap, axis_name="i")(f)\n',
        CALL_TOP + "\n" + MESH + 'g = placed_on(mesh, P("i"))(jax.jit(shard_map(per_device(f), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))\n')

  def test_a_partial_import_goes_only_where_a_converted_site_read_it_last(self):
    cases = [("h = partial(print, 1)\n", True),  # read elsewhere too
             ("", False)]
    for rest, kept in cases:
      new, _ = rewrite("from functools import partial\nimport jax\n\n"
                       f'g = partial(jax.pmap, axis_name="i")(f)\n{rest}')
      self.assertEqual("from functools import partial" in new, kept, new)
    # One nothing read before the rewrite is not the rewrite's to remove.
    new, _ = rewrite('import functools\nimport jax\n\ng = jax.pmap(f, "i")\n')
    self.assertIn("import functools\n", new)

  def test_parenthesised_site_keeps_parentheses(self):
    self._one('g = (jax.pmap(f, "i"))',
              'g = (placed_on(mesh, P("i"))(jax.jit(shard_map(per_device(f), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False))))')

  def test_assigned_to_attribute_and_returned_in_method(self):
    self.assertConverts("""
        import jax

        class Trainer:
            def __init__(self):
                self.step = jax.pmap(self.train, "b")

            def eval_fn(self):
                return jax.pmap(self.evaluate, "b")
        """, CALL_TOP + textwrap.dedent("""

        class Trainer:
            def __init__(self):
                mesh = jax.sharding.Mesh(jax.devices(), ("b",))
                self.step = placed_on(mesh, P("b"))(jax.jit(shard_map(
                    per_device(self.train), mesh=mesh, in_specs=P("b"), out_specs=P("b"), check_rep=False)))

            def eval_fn(self):
                mesh = jax.sharding.Mesh(jax.devices(), ("b",))
                return placed_on(mesh, P("b"))(jax.jit(shard_map(
                    per_device(self.evaluate), mesh=mesh, in_specs=P("b"), out_specs=P("b"), check_rep=False)))
        """))

  def test_sites_with_the_same_axes_share_one_mesh(self):
    # A file whose sites use several axis names names each mesh after its axis.
    self.assertConverts("""
        import jax

        a = jax.pmap(f, "i")
        b = jax.pmap(g, "j")
        c = jax.pmap(h, "i")
        """, CALL_TOP + textwrap.dedent("""

        i_mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        a = placed_on(i_mesh, P("i"))(jax.jit(shard_map(per_device(f), mesh=i_mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))
        j_mesh = jax.sharding.Mesh(jax.devices(), ("j",))
        b = placed_on(j_mesh, P("j"))(jax.jit(shard_map(per_device(g), mesh=j_mesh, in_specs=P("j"), out_specs=P("j"), check_rep=False)))
        c = placed_on(i_mesh, P("i"))(jax.jit(shard_map(per_device(h), mesh=i_mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))
        """))

  def test_pmap_as_a_value_becomes_the_support_function_with_its_signature(self):
    self.assertConverts("""
        import jax

        transform = jax.pmap if parallel else jax.vmap
        """, """
        import jax

        from pmap_shard_map import pmap_via_shard_map

        transform = pmap_via_shard_map if parallel else jax.vmap
        """)

  def test_partial_kept_as_a_value_partials_the_support_function(self):
    self.assertConverts("""
        import functools
        import jax

        ppmap = functools.partial(jax.pmap, axis_name="i")
        """, """
        import functools

        from pmap_shard_map import pmap_via_shard_map

        ppmap = functools.partial(pmap_via_shard_map, axis_name="i")
        """)

  def test_a_lambda_of_pmap_on_its_parameter_is_pmap_partially_applied(self):
    # As the partial above: its calls, whose rows legacy pmap chose its devices by, are not
    # in view. A lambda doing more, or mapping another function, is a site as any other.
    self.assertConverts("""
        import jax

        TRANSFORMS = {"pmap": lambda f: jax.pmap(f, "i"), "jit": jax.jit}
        twice = lambda f: jax.pmap(lambda x: f(f(x)), "i")
        """, """
        import jax
        from jax.sharding import PartitionSpec as P
        from jax.experimental.shard_map import shard_map

        from pmap_shard_map import per_device, placed_on, pmap_via_shard_map

        TRANSFORMS = {"pmap": lambda f: pmap_via_shard_map(f, "i"), "jit": jax.jit}
        mesh = jax.sharding.Mesh(jax.devices(), ("i",))
        twice = lambda f: placed_on(mesh, P("i"))(jax.jit(shard_map(per_device(lambda x: f(f(x))), mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))
        """)
