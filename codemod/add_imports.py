"""Adds the imports other rewrites scheduled, each into its place in the file's imports.

libcst's ``AddImportsVisitor`` appends what commands schedule after the file's imports.
This command places them as ``imports.add`` does for the pmap rewrite, the removed-names
and the row-access commands: into the run of imports holding the file's own ``jax``
import, each in its isort section (standard library, third party, first party,
relative), at its sorted place where the file's section is sorted, under the file's line
limit and its configured sorting (``source_text``). A name the file binds already is not
imported again.

  AddImportsCommand.schedule(context, imports.Wanted("jax.sharding", "PartitionSpec", "P"))
  tree = AddImportsCommand(context).transform_module(tree)
"""
from __future__ import annotations

import os

import libcst as cst
from libcst.codemod import Codemod, CodemodContext
from libcst.metadata import ScopeProvider

from codemod import imports
from codemod.source_text import SourceText

_SCHEDULED = "pmap_to_shmap.add_imports"  # context.scratch: the imports scheduled


class AddImportsCommand(Codemod):
  """Adds the scheduled imports (``schedule``) where the file keeps its own."""

  DESCRIPTION = "Add scheduled imports into the file's import sections, in its order."
  METADATA_DEPENDENCIES = (ScopeProvider,)

  @staticmethod
  def schedule(context: CodemodContext, wanted: imports.Wanted) -> None:
    """Asks for ``wanted`` in the file the next run of this command transforms."""
    scheduled = context.scratch.setdefault(_SCHEDULED, [])
    if wanted not in scheduled:
      scheduled.append(wanted)

  def transform_module_impl(self, tree: cst.Module) -> cst.Module:
    wanted = self.context.scratch.pop(_SCHEDULED, [])
    scope = self.get_metadata(ScopeProvider, tree, None)
    wanted = [w for w in wanted if not imports.binds(scope, w)]
    if not wanted:
      return tree
    path = self.context.filename
    text = SourceText(tree.code, path if path and os.path.isfile(path) else None)
    return imports.add_to_file(tree, wanted, text.style, path)
