"""Rewrites row access on the outputs of sites an earlier run converted, on its own.

The pmap rewrite plans row access with the sites it converts (``unreplicate``, in the same
walk). This libcst command runs that rewrite alone over code already converted, finding
the converted sites by the support functions they call:

  ``placed_on(mesh, specs)(jax.jit(...))``, ``on_first_call(lambda: ...)`` (an older
  run's ``on_first_call(...)(f)``), ``pmap_via_shard_map(f, ...)``,
  ``host_local_io(jax.jit(...), ...)``, and the defs they decorate (``@placed_on(...)``,
  ``@functools.partial(pmap_via_shard_map, ...)``, ...)

and rewriting, as the pmap rewrite does, ``out[0]`` of their outputs into
``first_row(out)`` and ``flax.jax_utils.unreplicate(t)`` / ``jax.tree.map(lambda x: x[0],
t)`` into ``first_rows(t)``, imported from the support module the file imports already.
Where the copy of that module the file finds (next to it, or in its package) lacks them,
``--write-support`` adds them to it, keeping what it holds (``support_module.write``: an
edited copy is never overwritten); without it, the command says so.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import cast

import libcst as cst
from libcst.codemod import CodemodContext, VisitorBasedCodemodCommand
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.metadata import PositionProvider, QualifiedNameProvider, ScopeProvider

from codemod import imports, support_module, together, unreplicate
from codemod.source_text import SourceText

# Support functions whose call is a converted site (it returns the site's function) ...
_SITE_CALLS = frozenset({"pmap_via_shard_map", "host_local_io", "on_first_call"})
# ... and those whose call returns a decorator that makes one.
_SITE_DECORATORS = frozenset({"placed_on", "on_first_call"})


class RowAccessCommand(VisitorBasedCodemodCommand):
  """Rewrites ``x[0]`` of converted sites' outputs into the support module's
  ``first_row`` / ``first_rows``."""

  DESCRIPTION = ("Rewrite x[0] of the outputs of sites pmap-to-shmap converted into "
                 "first_row(x), reading row 0 where legacy pmap did.")
  METADATA_DEPENDENCIES = (QualifiedNameProvider, ScopeProvider, PositionProvider)

  @staticmethod
  def add_args(arg_parser: argparse.ArgumentParser) -> None:
    arg_parser.add_argument(
        "--support-module", default=support_module.DEFAULT_NAME, metavar="MODULE",
        help="dotted name of the support module the converted files import, where it is "
             "not one pmap-to-shmap names (pmap_shard_map, PACKAGE._pmap_shard_map)")
    arg_parser.add_argument(
        "--write-support", action="store_true",
        help="add first_row / first_rows to the support module's copy the file imports "
             "where it lacks them")

  def __init__(self, context: CodemodContext,
               support_module: str = support_module.DEFAULT_NAME,
               write_support: bool = False) -> None:
    super().__init__(context)
    self.support_module = support_module
    self.write_support = write_support
    self._rewrites = unreplicate.Rewrites()
    self._spelling: str | None = None  # how the file imports the support module
    self._text = SourceText("")

  def _support_function(self, node: cst.BaseExpression) -> str | None:
    """The support function ``node`` names, if it names one."""
    for name in self.get_metadata(QualifiedNameProvider, node, set()):
      module, _, function = name.name.rpartition(".")
      last = module.rsplit(".", 1)[-1]
      if last.endswith(support_module.DEFAULT_NAME) or module == self.support_module:
        return function
    return None

  def _is_site(self, node: cst.BaseExpression) -> bool:
    """Whether ``node`` evaluates to a converted site's function."""
    if not isinstance(node, cst.Call):
      return False
    if self._support_function(node.func) in _SITE_CALLS:
      return True
    return (isinstance(node.func, cst.Call)
            and self._support_function(node.func.func) in _SITE_DECORATORS)

  def _is_site_decorator(self, decorator: cst.BaseExpression) -> bool:
    if self._support_function(decorator) in _SITE_CALLS:
      return True  # @pmap_via_shard_map
    if not isinstance(decorator, cst.Call):
      return False
    if self._support_function(decorator.func) in _SITE_DECORATORS:
      return True  # @placed_on(mesh, specs)
    first = decorator.args[0].value if decorator.args else None
    return first is not None and self._support_function(first) in _SITE_CALLS  # partial

  def visit_Module(self, node: cst.Module) -> bool:
    finder = _Sites(self._is_site, self._is_site_decorator, self.support_module)
    together.walk(node, [finder])
    self._spelling = finder.spelling
    if self._spelling is None or not (finder.calls or finder.defs):
      return False
    path = self.context.filename
    self._text = SourceText(node.code, path if path and os.path.isfile(path) else None)
    self._rewrites = unreplicate.plan(node, self.get_metadata, finder.calls, finder.defs,
                                      self._text.style.width, self._text.lines)
    for finding in self._rewrites.findings:
      self.warn(finding.format_warning())
    for module, name, alias in self._rewrites.flax_imports:
      RemoveImportsVisitor.remove_unused_import(self.context, module, name, alias)
    return bool(self._rewrites.nodes)

  def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
    return cast(cst.BaseExpression, self._rewrites.apply(original_node, updated_node))

  def leave_Subscript(self, original_node: cst.Subscript,
                      updated_node: cst.Subscript) -> cst.BaseExpression:
    return cast(cst.BaseExpression, self._rewrites.apply(original_node, updated_node))

  def leave_Lambda(self, original_node: cst.Lambda, updated_node: cst.Lambda) -> cst.BaseExpression:
    return cast(cst.BaseExpression, self._rewrites.apply(original_node, updated_node))

  def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
    support = support_module.import_of(self._spelling)
    names = self._rewrites.support_names()
    if support is None or not names:
      return updated_node
    module_name, relative = support
    self._ensure_support(module_name, relative, names)
    wanted = [imports.Wanted(module_name, name, relative=relative) for name in names]
    return imports.add_to_file(updated_node, wanted, self._text.style, self.context.filename)

  def _ensure_support(self, module_name: str, relative: int, names: list[str]) -> None:
    """Adds ``names`` to the copy of the support module the file imports, where it lacks
    them and ``--write-support`` is given; else says what the file now needs there."""
    path = self.context.filename
    if not path:
      return  # source given without a file: no copy to look at
    found = support_module.copy_for(path, module_name, relative)
    if found is None:
      self.warn(f"1:1 WARNING the support module {module_name} the file imports was not "
                f"found from {path}: its copy must hold {', '.join(names)}")
      return
    root, dotted = found
    text = support_module.read(root, dotted)
    if text is not None and set(names) <= support_module.held(text.partition("\n")[2]):
      return
    where = support_module.path_for(root, dotted)
    if not self.write_support:
      self.warn(f"1:1 WARNING {where} lacks {', '.join(names)}, which the file now imports: "
                "pass --write-support to add them, or run python -m codemod.pmap_to_shmap "
                "over the tree")
      return
    try:
      support_module.write(root, dotted, names)  # with what the copy holds
    except FileExistsError as e:
      self.warn(f"1:1 ERROR {e}")


class _Sites(cst.CSTVisitor):
  """The converted sites of a module (calls, and the defs they decorate), and how the
  module spells the support module it imports."""

  def __init__(self, is_site: Callable[[cst.BaseExpression], bool],
               is_site_decorator: Callable[[cst.BaseExpression], bool],
               support_name: str) -> None:
    self.is_site = is_site
    self.is_site_decorator = is_site_decorator
    self.support_name = support_name  # a name given on the command line
    self.calls: list[cst.CSTNode] = []
    self.defs: list[cst.FunctionDef] = []
    self.spelling: str | None = None

  def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
    module = cst.Module([]).code_for_node(node.module) if node.module else ""
    spelling = "." * len(node.relative) + module
    if module.rsplit(".", 1)[-1].endswith(support_module.DEFAULT_NAME) or (
        spelling == self.support_name):
      self.spelling = spelling
    return False

  def visit_Call(self, node: cst.Call) -> None:
    if self.is_site(node):
      self.calls.append(node)

  def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
    if any(self.is_site_decorator(d.decorator) for d in node.decorators):
      self.defs.append(node)
