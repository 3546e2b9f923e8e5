"""How a function hands values back: the ``return`` statements and ``yield`` expressions of
its own body, those of nested functions, lambdas and classes apart."""
from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst


@dataclass
class Exits:
  returns: list[cst.Return] = field(default_factory=list)
  yields: bool = False


def exits(function: cst.FunctionDef) -> Exits:
  """The returns and whether it yields, of ``function``'s own body."""
  found = _Finder()
  function.body.visit(found)
  return found.exits


class _Finder(cst.CSTVisitor):
  def __init__(self) -> None:
    self.exits = Exits()

  def visit_Return(self, node: cst.Return) -> None:
    self.exits.returns.append(node)

  def visit_Yield(self, node: cst.Yield) -> None:
    self.exits.yields = True

  def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
    return False

  def visit_Lambda(self, node: cst.Lambda) -> bool:
    return False

  def visit_ClassDef(self, node: cst.ClassDef) -> bool:
    return False
