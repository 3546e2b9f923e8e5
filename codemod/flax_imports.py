"""The ``flax.jax_utils`` imports a rewrite of one of its functions may leave unused."""
from __future__ import annotations

import libcst as cst

from codemod import site_comments


class FlaxImportsVisitor(cst.CSTVisitor):
  """Collects into ``flax_imports`` each ``import flax.jax_utils``, ``from flax import
  jax_utils`` and ``from flax.jax_utils import FUNCTION`` statement holding no comment, as
  ``(module, name, alias)`` for libcst's ``RemoveImportsVisitor.remove_unused_import``
  (which removes one only where nothing uses it after the rewrite)."""

  FUNCTION = ""  # the jax_utils function the subclass's rewrite replaces

  def __init__(self) -> None:
    super().__init__()
    self.flax_imports: list[tuple[str, str | None, str | None]] = []
    self._statement: cst.SimpleStatementLine | None = None

  def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
    self._statement = node

  def visit_Import(self, node: cst.Import) -> None:
    for alias in node.names:
      if alias.evaluated_name == "flax.jax_utils" and self._plain():
        self.flax_imports.append(("flax.jax_utils", None, alias.evaluated_alias))

  def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
    if node.module is None or node.relative or isinstance(node.names, cst.ImportStar):
      return
    module = cst.Module([]).code_for_node(node.module)
    wanted = {"flax": "jax_utils", "flax.jax_utils": self.FUNCTION}.get(module)
    for alias in node.names:
      if alias.evaluated_name == wanted and self._plain():
        self.flax_imports.append((module, wanted, alias.evaluated_alias))

  def _plain(self) -> bool:
    """No comment in or around the import statement: removing it loses none (libcst's
    RemoveImportsVisitor drops the statement with the comment lines above it)."""
    return self._statement is not None and not site_comments.comments_in(self._statement)
