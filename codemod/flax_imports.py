"""The ``flax.jax_utils`` imports a rewrite of one of its functions may leave unused."""
from __future__ import annotations

from collections.abc import Callable

import libcst as cst
from libcst.metadata import QualifiedNameProvider, ScopeProvider

from codemod import site_comments


def last_name(func: cst.BaseExpression) -> str | None:
  """``f`` of ``f`` or ``a.b.f``: what a call's function is named, before resolving it."""
  return func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)


class FlaxImportsVisitor(cst.CSTVisitor):
  """Collects into ``flax_imports`` each ``import flax.jax_utils``, ``from flax import
  jax_utils`` and ``from flax.jax_utils import FUNCTION`` statement holding no comment, as
  ``(module, name, alias)`` for libcst's ``RemoveImportsVisitor.remove_unused_import``
  (which removes one only where nothing uses it after the rewrite)."""

  FUNCTION = ""  # the jax_utils function the subclass's rewrite replaces

  def __init__(self, get_metadata: Callable) -> None:
    super().__init__()
    self.get_metadata = get_metadata  # type: ignore[method-assign]
    self.flax_imports: list[tuple[str, str | None, str | None]] = []
    self._statement: cst.SimpleStatementLine | None = None
    self._aliases: dict[cst.CSTNode, cst.BaseExpression] = {}  # ``ju`` of ju = flax.jax_utils

  def names(self, func: cst.BaseExpression) -> set[str]:
    """The qualified names of a called expression, with a module alias made by assignment
    (``ju = flax.jax_utils``; ``ju.replicate``) followed, as the import forms are."""
    names = {q.name for q in self.get_metadata(QualifiedNameProvider, func, set())}
    if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)):
      return names
    scope = self.get_metadata(ScopeProvider, func.value, None)
    if scope is None:
      return names
    referents = {r for access in scope.accesses[func.value] for r in access.referents}
    values = [self._aliases.get(getattr(r, "node", None)) for r in referents]  # type: ignore[arg-type]
    known = [v for v in values if v is not None]
    if not known or len(known) != len(values):
      return names
    bound = set.intersection(*({q.name for q in self.get_metadata(QualifiedNameProvider, v,
                                                                   set())} for v in known))
    return names | {f"{name}.{func.attr.value}" for name in bound}

  def visit_Assign(self, node: cst.Assign) -> None:
    if (len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name)
        and isinstance(node.value, (cst.Attribute, cst.Name))):
      self._aliases[node.targets[0].target] = node.value

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
