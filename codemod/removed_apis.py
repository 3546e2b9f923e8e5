"""Rewrites the names newest JAX removed into what it keeps (``--target jax``).

  ``jax.tree_map(f, x)`` and the rest of the ``jax.tree_*`` family, in any import form
      ->  ``jax.tree.map(f, x)``, ... (``removed_names.TREE_RENAMES``: the same functions)
  ``jax.device_put_replicated(x, devices)`` / ``jax.device_put_sharded(xs, devices)``
      ->  the support module's function of that name (same values, shapes and
          per-device placement)
  ``from jax import tree_map`` (a removed name)  ->  dropped where nothing else reads it

The removed modules with no mechanical replacement (``removed_names.REPORTED``) are
reported, left as they are. A one-line statement a longer name takes past the file's limit
is laid out again over lines where they fit (``edits.arguments_broken``).

``plan`` decides the rewrite from the patterns ``related.RelatedPatterns`` collected in a
walk it shares with other analyses (``convert_pmap`` runs it with the site rewrite on one
resolution of the metadata); ``RemovedApisCommand`` is the rewrite alone, as a libcst
command.
"""
from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import libcst as cst
from libcst.codemod import CodemodContext, VisitorBasedCodemodCommand
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.metadata import CodeRange, PositionProvider, QualifiedNameProvider, ScopeProvider

from codemod import edits, file_style, imports, related, removed_names, support_module, together
from codemod.findings import Finding, Severity
from codemod.source_text import SourceText


@dataclass
class Renames:
  """Whole names replaced in one file, keyed by original nodes (a Name or an Attribute).
  The site rewrite adds its own to the same table (pmap handed on as a value), which then
  lays out every line a replacement lengthened."""
  nodes: dict[cst.CSTNode, cst.BaseExpression] = field(default_factory=dict)
  lines: set[int] = field(default_factory=set)  # lines holding a replaced name
  support_names: list[str] = field(default_factory=list)  # support functions now called
  removed_imports: list[tuple[str, str, str | None]] = field(default_factory=list)
  findings: list[Finding] = field(default_factory=list)

  def replace(self, node: cst.CSTNode, new: cst.BaseExpression, line: int) -> None:
    self.nodes[node] = new
    self.lines.add(line)

  def code(self) -> list[str]:
    """Text of the new names (for the imports they need)."""
    return [cst.Module([]).code_for_node(new) for new in self.nodes.values()]

  def apply(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:
    """The new node for ``original``, in ``updated``'s parentheses."""
    new = self.nodes.get(original)
    if new is None:
      return updated
    return new.with_changes(lpar=getattr(updated, "lpar", ()), rpar=getattr(updated, "rpar", ()))

  def fitted(self, at: CodeRange, updated: cst.SimpleStatementLine, indent: str,
             style: file_style.FileStyle) -> cst.SimpleStatementLine:
    """A one-line statement (originally at ``at``) a replacement took past the limit,
    laid out again over lines where they fit; else as it is."""
    if at.start.line != at.end.line or at.start.line not in self.lines:
      return updated
    code = cst.Module([]).code_for_node(updated.with_changes(leading_lines=[])).rstrip("\n")
    if len(indent) + len(code) <= style.width:
      return updated
    return edits.arguments_broken(updated, indent, style) or updated


def plan(patterns: related.RelatedPatterns, position: Callable[[cst.CSTNode], CodeRange],
         support_spelling: str | None,
         taken: Callable[[cst.CSTNode, list[str]], list[str]],
         into: Renames | None = None) -> Renames:
  """The rewrite of the removed names ``patterns`` found (walked with ``target='jax'``;
  what it reports stays in its findings), added to ``into`` where given;
  ``support_spelling``: the dotted name the support module is imported by; ``taken``:
  which of the support names the scope at a node binds otherwise
  (``support_module.taken``), where a call keeps JAX's name and is reported."""
  renames = Renames() if into is None else into
  renames.removed_imports.extend(patterns.removed_imports)
  planned = [(node, edits.parse_expression(new_name),
              f"{_code(node)} rewritten to {new_name}, which newest JAX keeps")
             for node, new_name in patterns.renames]
  calls = []
  for node, support_name in patterns.support_calls:
    at = position(node).start
    if taken(node, [support_name]):
      renames.findings.append(Finding(at.line, at.column + 1, Severity.WARNING, (
          f"{_code(node)} left as is: the file binds {support_name}, which the support "
          f"module's replacement would be imported as; rename it, then rerun")))
      continue
    calls.append(support_name)
    planned.append((node, cst.Name(support_name), removed_names.SUPPORT_CALL_MESSAGE.format(
        old=_code(node), new=support_name,
        module=support_spelling or support_module.DEFAULT_NAME)))
  for node, new, message in planned:
    at = position(node).start
    renames.replace(node, new, at.line)
    renames.findings.append(Finding(at.line, at.column + 1, Severity.INFO, message))
  for support_name in calls:
    if support_name not in renames.support_names:
      renames.support_names.append(support_name)
  return renames


def _code(node: cst.CSTNode) -> str:
  return cst.Module([]).code_for_node(node)


class RemovedApisCommand(VisitorBasedCodemodCommand):
  """Rewrites the names newest JAX removed into what it keeps; reports the rest."""

  DESCRIPTION = ("Rewrite jax.tree_map and the rest of the names newest JAX removed into what "
                 "it keeps.")
  METADATA_DEPENDENCIES = (QualifiedNameProvider, PositionProvider, ScopeProvider)

  @staticmethod
  def add_args(arg_parser: argparse.ArgumentParser) -> None:
    arg_parser.add_argument(
        "--support-module", default=support_module.DEFAULT_NAME, metavar="MODULE",
        help="dotted name the rewritten device_put_replicated / device_put_sharded calls "
             "import their replacements from")

  def __init__(self, context: CodemodContext,
               support_module: str = support_module.DEFAULT_NAME) -> None:
    super().__init__(context)
    self.support_module = support_module
    self._renames = Renames()
    self._text: SourceText | None = None  # set where there is anything to rewrite

  def visit_Module(self, node: cst.Module) -> bool:
    patterns = related.RelatedPatterns(self.get_metadata, "jax", removed_only=True)
    together.walk(node, [patterns])
    self._renames = plan(patterns, lambda n: self.get_metadata(PositionProvider, n),
                         self.support_module,
                         functools.partial(support_module.taken, self.get_metadata))
    for finding in sorted(patterns.findings + self._renames.findings,
                          key=lambda f: (f.line, f.column)):
      self.warn(finding.format_warning())
    for module, name, alias in self._renames.removed_imports:
      RemoveImportsVisitor.remove_unused_import(self.context, module, name, alias)
    if not self._renames.nodes:
      return False
    path = self.context.filename
    self._text = SourceText(node.code, path if path and os.path.isfile(path) else None)
    return True

  def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
    return cast(cst.BaseExpression, self._renames.apply(original_node, updated_node))

  def leave_Attribute(self, original_node: cst.Attribute,
                      updated_node: cst.Attribute) -> cst.BaseExpression:
    return cast(cst.BaseExpression, self._renames.apply(original_node, updated_node))

  def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                updated_node: cst.SimpleStatementLine
                                ) -> cst.SimpleStatementLine:
    if updated_node is original_node or self._text is None:
      return updated_node
    at = self.get_metadata(PositionProvider, original_node)
    return self._renames.fitted(at, updated_node, self._text.indent_of(at.start.line),
                                self._text.style)

  def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
    names = self._renames.support_names
    support = support_module.import_of(self.support_module)
    if not names or support is None:
      return updated_node
    module_name, relative = support
    # ``from jax import device_put_replicated``: the support import takes over its name.
    updated_node = imports.without(updated_node, ("jax", "jax.api"), set(names))
    assert self._text is not None  # set where there is anything to rewrite
    wanted = [imports.Wanted(module_name, name, relative=relative) for name in names]
    return imports.add_to_file(updated_node, wanted, self._text.style, self.context.filename)
