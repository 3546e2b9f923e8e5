"""Rule: patterns around pmap get report entries with guidance, and the code is not changed."""
import textwrap

from libcst.codemod import CodemodTest

from codemod.shim import PmapToShimCommand
from codemod_testing import PmapCodemodTest, rewrite


def _entries(source, **options):
  _, findings = rewrite(textwrap.dedent(source), **options)
  return [(f.line, f.severity.value, f.message) for f in findings]


class RelatedPatternsTest(PmapCodemodTest):

  def test_device_put_replicated_gets_a_warning_with_the_replacement(self):
    source = """
        import jax

        params = jax.device_put_replicated(params, jax.local_devices())
        """
    self.assertUnchanged(source)
    [(line, severity, message)] = _entries(source)
    assert (line, severity) == (4, "WARNING")
    assert "removed in newer JAX" in message and "jnp.stack([v] * len(devices))" in message

  def test_device_put_sharded_gets_a_warning(self):
    [(_, severity, message)] = _entries("""
        import jax

        x = jax.device_put_sharded(shards, jax.devices())
        """)
    assert severity == "WARNING" and "jnp.stack(s), *shards" in message

  def test_unreplicate_idioms_get_info(self):
    entries = _entries("""
        import jax
        from flax import jax_utils

        a = jax_utils.unreplicate(state)
        b = jax.tree.map(lambda x: x[0], metrics)
        """)
    assert [(l, s) for l, s, _ in entries] == [(5, "INFO"), (6, "INFO")]
    assert all("out_axes=None" in m for _, _, m in entries)

  def test_local_device_count_reshape_gets_info(self):
    entries = _entries("""
        import jax

        x = batch.reshape((jax.local_device_count(), -1) + batch.shape[1:])
        n = jax.local_device_count()
        """)
    assert [(l, s) for l, s, _ in entries] == [(4, "INFO")]

  def test_multi_process_code_is_not_reported(self):
    # Every converted site takes each process's host-local arrays, as pmap did: placed_on
    # in the plain form, host_local_io around the old form. Nothing to rerun with.
    for site in ("jax.pmap(lambda x: x * 2)",
                 "jax.pmap(lambda x, n: x * n, static_broadcasted_argnums=1)"):
      source = f"""
          import jax

          step = {site}
          if jax.process_index() == 0:
              print(jax.process_count())
          """
      for options in ({}, {"multihost": True}):
        entries = _entries(source, **options)
        assert [s for _, s, _ in entries] == ["INFO"], entries
        assert not any("--multihost" in m for _, _, m in entries), entries

  def test_process_index_in_a_file_with_nothing_converted_is_not_reported(self):
    # Nothing there raises under several processes: the warning would be noise.
    assert _entries("""
        import jax

        if jax.process_index() == 0:
            print(jax.process_count())
        """) == []
    assert not [e for e in _entries("""
        import jax

        f = jax.pmap(*args)
        print(jax.process_index())
        """) if e[1] == "WARNING"]

  def test_unrelated_names_are_not_reported(self):
    assert _entries("""
        import jax
        from mylib import device_put_replicated

        device_put_replicated(x)
        y = z[0]
        """) == []


class ShimTest(CodemodTest):
  TRANSFORM = PmapToShimCommand

  def test_attribute_sites_and_decorators(self):
    self.assertCodemod("""
        import functools
        import jax

        @functools.partial(jax.pmap, axis_name="i")
        def f(x):
            return x

        g = jax.pmap(h)
        """, """
        import functools
        import jax
        import pmap_compat

        @functools.partial(pmap_compat.pmap, axis_name="i")
        def f(x):
            return x

        g = pmap_compat.pmap(h)
        """)

  def test_from_import_is_replaced(self):
    self.assertCodemod("""
        from jax import pmap as p

        g = p(h, "i")
        k = p
        """, """
        import pmap_compat

        g = pmap_compat.pmap(h, "i")
        k = pmap_compat.pmap
        """)

  def test_other_pmaps_are_untouched(self):
    self.assertCodemod("""
        from mylib import pmap

        g = pmap(h)
        """, """
        from mylib import pmap

        g = pmap(h)
        """)
