"""Where code binds or deletes names, for visitors that must tell those places from reads,
and the values plain assignments bind."""
from __future__ import annotations

import libcst as cst


class BindingTargets(cst.CSTVisitor):
  """Hands ``bound_target`` each target that an assignment (plain, augmented, annotated),
  a ``del``, a ``for`` loop, a comprehension or an ``as`` clause binds; tuples, lists and
  starred targets element by element."""

  def bound_target(self, target: cst.BaseExpression) -> None:
    raise NotImplementedError

  def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
    self._each(node.target)

  def visit_AugAssign(self, node: cst.AugAssign) -> None:
    self._each(node.target)

  def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
    self._each(node.target)

  def visit_Del(self, node: cst.Del) -> None:
    self._each(node.target)

  def visit_For(self, node: cst.For) -> None:
    self._each(node.target)

  def visit_CompFor(self, node: cst.CompFor) -> None:
    self._each(node.target)

  def visit_AsName(self, node: cst.AsName) -> None:
    self._each(node.name)

  def _each(self, target: cst.BaseExpression) -> None:
    if isinstance(target, (cst.Tuple, cst.List)):
      for element in target.elements:
        self._each(element.value)
    elif isinstance(target, cst.StarredElement):
      self._each(target.value)
    else:
      self.bound_target(target)


class AssignedValues(cst.CSTVisitor):
  """Each name a plain ``name = value`` binds in a body, with its value (nested function
  and class bodies are other scopes)."""

  def __init__(self, values: dict[cst.CSTNode, cst.BaseExpression]):
    self.values = values
    self.depth = 0

  def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
    self.depth += 1
    return self.depth == 1

  def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
    self.depth -= 1

  def visit_ClassDef(self, node: cst.ClassDef) -> bool:
    return False

  def visit_Assign(self, node: cst.Assign) -> None:
    for target in node.targets:
      if isinstance(target.target, cst.Name):
        self.values[target.target] = node.value
