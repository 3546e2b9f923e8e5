"""Rule: ``row_access.RowAccessCommand`` rewrites row access on the outputs of sites an
earlier run converted, on its own as a libcst command, as the pmap rewrite does with the
sites it converts; what it cannot prove a site's output stays as written."""
import textwrap

import libcst as cst
import pytest
from libcst.codemod import CodemodContext, CodemodTest

from codemod import support_module
from codemod.row_access import RowAccessCommand
from codemod_testing import rewrite

WHY = (", which reads row 0 from the device holding it (x[0] on the converted output is a "
       "gather across devices, compiled per shape); same values, dtype and shape")


class RowAccessTest(CodemodTest):
  TRANSFORM = RowAccessCommand

  def test_outputs_of_a_converted_call_site(self):
    self.assertCodemod("""
        import jax
        import numpy as np
        from jax.sharding import PartitionSpec as P

        from pmap_shard_map import per_device, placed_on


        def train(x, state):
          mesh = jax.sharding.Mesh(jax.devices(), ("i",))
          step = placed_on(mesh, P("i"))(
              jax.jit(jax.shard_map(per_device(lambda s, v: s + v), mesh=mesh,
                                    in_specs=P("i"), out_specs=P("i"),
                                    check_vma=False)))
          out = step(state, x)
          model = (np.zeros(3), 1)
          print(model[0], out[0])
          return jax.tree.map(lambda a: a[0], out)
        """, """
        import jax
        import numpy as np
        from jax.sharding import PartitionSpec as P

        from pmap_shard_map import first_row, first_rows, per_device, placed_on


        def train(x, state):
          mesh = jax.sharding.Mesh(jax.devices(), ("i",))
          step = placed_on(mesh, P("i"))(
              jax.jit(jax.shard_map(per_device(lambda s, v: s + v), mesh=mesh,
                                    in_specs=P("i"), out_specs=P("i"),
                                    check_vma=False)))
          out = step(state, x)
          model = (np.zeros(3), 1)
          print(model[0], first_row(out))
          return first_rows(out)
        """, expected_warnings=[
            "16:19 INFO [0] of a converted pmap site's output rewritten to first_row(...)"
            + WHY,
            "17:10 INFO a tree map of lambda x: x[0] rewritten to first_rows(...)" + WHY])

  def test_outputs_of_a_converted_decorator_site_in_a_package(self):
    self.assertCodemod("""
        import functools

        import jax
        from flax import jax_utils
        from jax.sharding import PartitionSpec as P

        from .._pmap_shard_map import per_device, placed_on

        mesh = jax.sharding.Mesh(jax.devices(), ("batch",))


        @placed_on(mesh, P("batch"))
        @jax.jit
        @functools.partial(jax.shard_map, mesh=mesh, in_specs=P("batch"),
                           out_specs=P("batch"), check_vma=False)
        @per_device
        def update(state, batch):
          return state


        def fit(state, batch):
          state = update(state, batch)
          return jax_utils.unreplicate(state)
        """, """
        import functools

        import jax
        from jax.sharding import PartitionSpec as P

        from .._pmap_shard_map import first_rows, per_device, placed_on

        mesh = jax.sharding.Mesh(jax.devices(), ("batch",))


        @placed_on(mesh, P("batch"))
        @jax.jit
        @functools.partial(jax.shard_map, mesh=mesh, in_specs=P("batch"),
                           out_specs=P("batch"), check_vma=False)
        @per_device
        def update(state, batch):
          return state


        def fit(state, batch):
          state = update(state, batch)
          return first_rows(state)
        """, expected_warnings=[
            "23:10 INFO flax.jax_utils.unreplicate rewritten to first_rows" + WHY])

  def test_outputs_of_a_site_made_on_its_first_call(self):
    self.assertCodemod("""
        import functools

        import jax
        from jax.sharding import PartitionSpec as P

        from .._pmap_shard_map import on_first_call, per_device, placed_on


        @functools.cache
        def mesh():
          return jax.sharding.Mesh(jax.devices(), ("i",))


        total = on_first_call(
            lambda: placed_on(mesh(), P("i"))(
                jax.jit(jax.shard_map(per_device(lambda x: jax.lax.psum(x, "i")),
                                      mesh=mesh(), in_specs=P("i"), out_specs=P("i"),
                                      check_vma=False))))


        def count(x):
          return total(x)[0]
        """, """
        import functools

        import jax
        from jax.sharding import PartitionSpec as P

        from .._pmap_shard_map import first_row, on_first_call, per_device, placed_on


        @functools.cache
        def mesh():
          return jax.sharding.Mesh(jax.devices(), ("i",))


        total = on_first_call(
            lambda: placed_on(mesh(), P("i"))(
                jax.jit(jax.shard_map(per_device(lambda x: jax.lax.psum(x, "i")),
                                      mesh=mesh(), in_specs=P("i"), out_specs=P("i"),
                                      check_vma=False))))


        def count(x):
          return first_row(total(x))
        """, expected_warnings=[
            "22:10 INFO [0] of a converted pmap site's output rewritten to first_row(...)"
            + WHY])

  def test_a_file_without_converted_sites_is_left(self):
    source = """
        import jax

        out = jax.jit(lambda x: x)(x)
        y = out[0]
        """
    self.assertCodemod(source, source, expected_skip=False)


# The pmap rewrite's row access, then the same program with it undone by hand.
SOURCE = """\
import jax
import numpy as np


def train(x, state):
  step = jax.pmap(lambda s, v: s + v, axis_name="i")
  state = step(state, x)
  out = step(state, x)
  model = (np.zeros(3), 1)
  print(model[0], out[0])
  return jax.tree.map(lambda a: a[0], state)
"""
UNDONE = {"first_row(out)": "out[0]", "first_rows(state)": "jax.tree.map(lambda a: a[0], state)",
          "first_row, first_rows, per_device": "per_device"}


@pytest.mark.parametrize("target", ["jax", "experimental"])
def test_alone_as_in_the_pmap_rewrite(target):
  converted = rewrite(SOURCE, target=target)[0]
  undone = converted
  for new, old in UNDONE.items():
    assert new in undone
    undone = undone.replace(new, old)
  alone = RowAccessCommand(CodemodContext()).transform_module(cst.parse_module(undone)).code
  assert alone == converted
  # over its own output, nothing is left to rewrite
  again = RowAccessCommand(CodemodContext()).transform_module(cst.parse_module(alone)).code
  assert again == alone


def test_another_support_module_name():
  source = textwrap.dedent("""\
      from myproject.parallel import pmap_via_shard_map

      step = pmap_via_shard_map(lambda v: v, axis_name=name)
      y = step(x)[0]
      """)
  new = RowAccessCommand(CodemodContext(), support_module="myproject.parallel"
                         ).transform_module(cst.parse_module(source)).code
  assert new == source.replace(
      "import pmap_via_shard_map", "import first_row, pmap_via_shard_map").replace(
      "step(x)[0]", "first_row(step(x))")


PACKAGE_MODULE = """\
import jax
from jax.sharding import PartitionSpec as P

from .._pmap_shard_map import per_device, placed_on


def train(x):
  mesh = jax.sharding.Mesh(jax.devices(), ("i",))
  step = placed_on(mesh, P("i"))(
      jax.jit(jax.shard_map(per_device(lambda v: v * 2), mesh=mesh, in_specs=P("i"),
                            out_specs=P("i"), check_vma=False)))
  return step(x)[0]
"""


@pytest.mark.parametrize("write", [False, True])
def test_the_support_copy_the_file_imports_gets_first_row(tmp_path, write):
  """A copy written for the sites alone lacks first_row: --write-support adds it to the
  copy the file imports (keeping what it holds); without it, the command says so."""
  (tmp_path / "pkg" / "sub").mkdir(parents=True)
  for init in ("pkg/__init__.py", "pkg/sub/__init__.py"):
    (tmp_path / init).write_text("")
  support_module.write(str(tmp_path), "pkg._pmap_shard_map", {"per_device", "placed_on"})
  copy = tmp_path / "pkg" / "_pmap_shard_map.py"
  before = copy.read_text()
  module = tmp_path / "pkg" / "sub" / "train.py"
  module.write_text(PACKAGE_MODULE)
  context = CodemodContext(filename=str(module))
  new = RowAccessCommand(context, write_support=write).transform_module(
      cst.parse_module(PACKAGE_MODULE)).code
  assert "from .._pmap_shard_map import first_row, per_device, placed_on" in new
  assert "return first_row(step(x))" in new
  if write:
    assert support_module.held(copy.read_text()) >= {"first_row", "per_device", "placed_on"}
    assert support_module.status_at(str(tmp_path), "pkg._pmap_shard_map", {
        "first_row", "per_device", "placed_on"}) is support_module.Status.CURRENT
    assert not [w for w in context.warnings if "lacks" in w]
  else:
    assert copy.read_text() == before
    assert [w for w in context.warnings if "lacks first_row" in w and "--write-support" in w]
