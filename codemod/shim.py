"""``--strategy shim``: the minimal step, every JAX pmap reference -> ``pmap_compat.pmap``.

``pmap_compat.pmap`` is a drop-in for legacy ``jax.pmap`` built on shard_map, so the
call sites, decorators and ``partial(jax.pmap, ...)`` uses keep their arguments as
they are. References are found by meaning (QualifiedNameProvider); the now-unused
``from jax import pmap`` is removed.
"""
from __future__ import annotations

import libcst as cst
from libcst.codemod import CodemodContext, VisitorBasedCodemodCommand
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.metadata import PositionProvider, QualifiedNameProvider

from codemod.findings import SITES_KEY, Finding, Severity
from codemod.sites import PMAP_NAMES, pmap_imports_of


class PmapToShimCommand(VisitorBasedCodemodCommand):
  """Rewrites every reference to JAX's pmap into ``pmap_compat.pmap``."""

  DESCRIPTION = "Replace jax.pmap with the drop-in pmap_compat.pmap."
  METADATA_DEPENDENCIES = (QualifiedNameProvider, PositionProvider)

  def __init__(self, context: CodemodContext) -> None:
    super().__init__(context)
    self._imports: list[tuple[str, str | None]] = []
    self._replaced = 0

  def transform_module_impl(self, tree: cst.Module) -> cst.Module:
    self._imports, self._replaced = [], 0  # libcst's runner reuses a command across files
    new = super().transform_module_impl(tree)
    self.context.scratch[SITES_KEY] = (self._replaced, self._replaced)
    return new

  def visit_Import(self, node: cst.Import) -> bool:
    return False

  def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
    self._imports.extend(pmap_imports_of(node))
    return False

  def _is_pmap(self, node: cst.CSTNode) -> bool:
    return bool({q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}
                & PMAP_NAMES)

  def _replace(self, original: cst.CSTNode) -> cst.BaseExpression:
    pos = self.get_metadata(PositionProvider, original).start
    self._replaced += 1
    self.warn(Finding(pos.line, pos.column + 1, Severity.INFO,
                      "pmap replaced by pmap_compat.pmap").format_warning())
    AddImportsVisitor.add_needed_import(self.context, "pmap_compat")
    for module, alias in self._imports:
      RemoveImportsVisitor.remove_unused_import(self.context, module, "pmap", alias)
    return cst.Attribute(cst.Name("pmap_compat"), cst.Name("pmap"),
                         lpar=getattr(original, "lpar", ()), rpar=getattr(original, "rpar", ()))

  def visit_Attribute(self, node: cst.Attribute) -> bool:
    return not self._is_pmap(node)

  def leave_Attribute(self, original_node: cst.Attribute,
                      updated_node: cst.Attribute) -> cst.BaseExpression:
    return self._replace(original_node) if self._is_pmap(original_node) else updated_node

  def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
    return self._replace(original_node) if self._is_pmap(original_node) else updated_node
