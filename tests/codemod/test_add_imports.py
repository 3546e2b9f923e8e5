"""``add_imports.AddImportsCommand``: the imports other rewrites schedule join the file's
import sections in its order, as the pmap rewrite places its own; names the file binds
are not imported again; nothing scheduled, nothing changed."""
import textwrap

import libcst as cst
from libcst.codemod import CodemodContext, CodemodTest

from codemod import imports
from codemod.add_imports import AddImportsCommand
from codemod_testing import rewrite

W = imports.Wanted
P_SPEC = W("jax.sharding", "PartitionSpec", "P")
SUPPORT = W("pmap_shard_map", "per_device")


class ScheduledTest(CodemodTest):
  TRANSFORM = AddImportsCommand

  def _scheduled(self, before: str, after: str, wanted: list[imports.Wanted]) -> None:
    context = CodemodContext()
    for w in wanted:
      AddImportsCommand.schedule(context, w)
    new = AddImportsCommand(context).transform_module(
        cst.parse_module(textwrap.dedent(before)))
    self.assertCodeEqual(textwrap.dedent(after), new.code)

  def test_each_import_joins_its_section(self):
    self._scheduled('''
        """Train."""
        import os

        import jax
        import numpy as np

        from mypkg import util

        x = 1
        ''', '''
        """Train."""
        import functools
        import os

        import jax
        import numpy as np
        from jax.sharding import PartitionSpec as P

        from mypkg import util
        from pmap_shard_map import per_device

        x = 1
        ''', [W("functools"), P_SPEC, SUPPORT])

  def test_a_name_the_file_binds_is_not_imported_again(self):
    self._scheduled('''
        import jax
        from jax.sharding import PartitionSpec as P
        ''', '''
        import jax
        from jax.sharding import PartitionSpec as P
        ''', [P_SPEC, W("jax")])

  def test_nothing_scheduled_leaves_the_file(self):
    self.assertCodemod("import jax\n\nx = 1\n", "import jax\n\nx = 1\n")


def test_the_pipeline_places_its_imports_as_the_command_does():
  """The pmap rewrite's new imports, scheduled on the original file, land where the
  rewrite puts them."""
  source = textwrap.dedent('''\
      import os

      import jax
      import numpy as np


      def run(x):
        return jax.pmap(lambda v: jax.lax.psum(v, "i"), "i")(x)
      ''')
  converted = rewrite(source, target="experimental")[0]
  context = CodemodContext()
  for w in [W("jax.experimental.shard_map", "shard_map"), P_SPEC,
            *(W("pmap_shard_map", name) for name in ("per_device", "placed_on", "pmap_devices"))]:
    AddImportsCommand.schedule(context, w)
  added = AddImportsCommand(context).transform_module(cst.parse_module(source)).code
  assert added.split("\n\n\ndef ")[0] == converted.split("\n\n\ndef ")[0]
