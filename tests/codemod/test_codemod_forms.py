"""Rule: every form of pmap site -- decorators, partial, calls on any kind of function, in
any position -- becomes jax.jit over _pmap_as_shard_map with the same arguments."""
import textwrap

from codemod_testing import PmapCodemodTest

TOP = """
import jax
import functools
from jax.sharding import PartitionSpec as P
from jax.experimental.shard_map import shard_map
"""


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



        @jax.jit
        @on_pmap_mesh(functools.partial(shard_map, in_specs=P("pmap_axis"), out_specs=P("pmap_axis"), check_rep=False), drop_device_axis=True)
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




        @functools.partial(jax.jit, donate_argnums=(0,))
        @on_pmap_mesh(functools.partial(shard_map, in_specs=P("batch"), out_specs=P("batch"), check_rep=False), drop_device_axis=True)
        def step(params, x):
            return params
        """.replace('@functools.partial(_pmap_as_shard_map, axes=("batch",), in_specs=P("batch"), out_specs=P("batch"))',
                    '@functools.partial(\n            _pmap_as_shard_map, axes=("batch",), in_specs=P("batch"), out_specs=P("batch"))'))

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




        @jax.jit
        @on_pmap_mesh(partial(shard_map, in_specs=P("i"), out_specs=P("i"), check_rep=False), drop_device_axis=True)
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



        @trace
        # the step
        @jax.jit
        @on_pmap_mesh(functools.partial(shard_map, in_specs=P("pmap_axis"), out_specs=P("pmap_axis"), check_rep=False), drop_device_axis=True)
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



        class Model:
            @jax.jit
            @on_pmap_mesh(functools.partial(shard_map, in_specs=P("pmap_axis"), out_specs=P("pmap_axis"), check_rep=False), drop_device_axis=True)
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
                        TOP + "\n\n# <pmap-to-shmap helpers>\n\n\n" + after_expr + "\n")

  def test_name(self):
    self._one('g = jax.pmap(f, "i")',
              'g = jax.jit(on_pmap_mesh(functools.partial(shard_map, in_specs=P("i"), out_specs=P("i"), check_rep=False), drop_device_axis=True)(f))')

  def test_attribute_function(self):
    self._one('g = jax.pmap(model.apply, "i")',
              'g = jax.jit(\n    on_pmap_mesh(functools.partial(shard_map, in_specs=P("i"), out_specs=P("i"), check_rep=False), drop_device_axis=True)(model.apply))')

  def test_lambda(self):
    self._one('g = jax.pmap(lambda x: x + 1, "i")',
              'g = jax.jit(\n    on_pmap_mesh(functools.partial(shard_map, in_specs=P("i"), out_specs=P("i"), check_rep=False), drop_device_axis=True)(lambda x: x + 1))')

  def test_partial_function(self):
    self._one('g = jax.pmap(functools.partial(f, k=2), "i")',
              'g = jax.jit(\n    on_pmap_mesh(functools.partial(shard_map, in_specs=P("i"), out_specs=P("i"), check_rep=False), drop_device_axis=True)(functools.partial(f, k=2)))')

  def test_call_expression_function(self):
    self._one('g = jax.pmap(make_step(config), "i")',
              'g = jax.jit(\n    on_pmap_mesh(functools.partial(shard_map, in_specs=P("i"), out_specs=P("i"), check_rep=False), drop_device_axis=True)(make_step(config)))')

  def test_fun_keyword(self):
    self._one('g = jax.pmap(fun=f, axis_name="i")',
              'g = jax.jit(on_pmap_mesh(functools.partial(shard_map, in_specs=P("i"), out_specs=P("i"), check_rep=False), drop_device_axis=True)(f))')

  def test_invoked_immediately(self):
    self._one('y = jax.pmap(f, "i")(x)',
              'y = jax.jit(on_pmap_mesh(functools.partial(shard_map, in_specs=P("i"), out_specs=P("i"), check_rep=False), drop_device_axis=True)(f))(x)')

  def test_passed_on(self):
    self._one('run(jax.pmap(f, "i"), data)',
              'run(jax.jit(on_pmap_mesh(functools.partial(shard_map, in_specs=P("i"), out_specs=P("i"), check_rep=False), drop_device_axis=True)(f)), data)')

  def test_partial_then_called(self):
    self._one('g = functools.partial(jax.pmap, axis_name="i")(f)',
              'g = jax.jit(on_pmap_mesh(functools.partial(shard_map, in_specs=P("i"), out_specs=P("i"), check_rep=False), drop_device_axis=True)(f))',
              prelude="import functools\n")

  def test_parenthesised_site_keeps_parentheses(self):
    self._one('g = (jax.pmap(f, "i"))',
              'g = (jax.jit(on_pmap_mesh(functools.partial(shard_map, in_specs=P("i"), out_specs=P("i"), check_rep=False), drop_device_axis=True)(f)))')

  def test_assigned_to_attribute_and_returned_in_method(self):
    self.assertConverts("""
        import jax

        class Trainer:
            def __init__(self):
                self.step = jax.pmap(self.train, "b")

            def eval_fn(self):
                return jax.pmap(self.evaluate, "b")
        """, top("""



        class Trainer:
            def __init__(self):
                self.step = jax.jit(
                    on_pmap_mesh(functools.partial(shard_map, in_specs=P("b"), out_specs=P("b"), check_rep=False), drop_device_axis=True)(self.train))

            def eval_fn(self):
                return jax.jit(
                    on_pmap_mesh(functools.partial(shard_map, in_specs=P("b"), out_specs=P("b"), check_rep=False), drop_device_axis=True)(self.evaluate))
        """))

  def test_two_sites_share_one_helper_block(self):
    self.assertConverts("""
        import jax

        a = jax.pmap(f, "i")
        b = jax.pmap(g, "j")
        """, top("""



        a = jax.jit(on_pmap_mesh(functools.partial(shard_map, in_specs=P("i"), out_specs=P("i"), check_rep=False), drop_device_axis=True)(f))
        b = jax.jit(on_pmap_mesh(functools.partial(shard_map, in_specs=P("j"), out_specs=P("j"), check_rep=False), drop_device_axis=True)(g))
        """))

  def test_pmap_as_a_value_is_reported_and_left(self):
    self.assertUnchanged("""
        import jax

        transform = jax.pmap if parallel else jax.vmap
        """)

  def test_partial_kept_as_a_value_is_left(self):
    self.assertUnchanged("""
        import functools
        import jax

        ppmap = functools.partial(jax.pmap, axis_name="i")
        """)
