"""Which converted sites sit in a library's public API.

A site there changes what every caller of the library gets, not only the repository's
own code, so the report says so at the site. Public means: a module of a package (not a
script, not a test) none of whose dotted parts is private, and in it a function, a class
(and its public or special method) or a module-level name that does not start with
``_``. A site anywhere inside such a definition counts, a nested function's included,
where the function hands something back (a ``return`` with a value, or a ``yield``):
one that returns nothing (a barrier, an assertion) hands its callers nothing of the site.
"""
from __future__ import annotations

import os
from collections.abc import Callable

import libcst as cst
from libcst.metadata import PositionProvider

from codemod import function_exits, support_module


def _private(name: str) -> bool:
  return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_name(path: str) -> str | None:
  """The dotted name of the public library module at ``path``; None for a script, a
  notebook, a test module or a private one."""
  package = support_module.package_of(path) if path.endswith(".py") else None
  if package is None:
    return None  # a script, or a notebook
  stem = os.path.splitext(os.path.basename(path))[0]
  parts = package[1] + ([] if stem == "__init__" else [stem])
  if any(_private(p) or p in ("test", "tests") or p.startswith("test_") or p.endswith("_test")
         or p == "conftest" for p in parts):
    return None
  return ".".join(parts)


def _lines(get_metadata: Callable, node: cst.CSTNode) -> range:
  """The lines a statement spans, its decorators included."""
  pos = get_metadata(PositionProvider, node)
  decorators = getattr(node, "decorators", ())
  start = min([pos.start.line, *(get_metadata(PositionProvider, d).start.line
                                  for d in decorators)])
  return range(start, pos.end.line + 1)


def _assigned_names(statement: cst.SimpleStatementLine) -> list[str]:
  names = []
  for small in statement.body:
    targets = ([t.target for t in small.targets] if isinstance(small, cst.Assign)
               else [small.target] if isinstance(small, cst.AnnAssign) else [])
    names += [t.value for t in targets if isinstance(t, cst.Name)]
  return names


class PublicApi:
  """The public definitions of one module; each function's body is read once."""

  def __init__(self, module: cst.Module, get_metadata: Callable) -> None:
    self._module = module
    self._get = get_metadata
    self._hands_back: dict[cst.FunctionDef, bool] = {}

  def _public_function(self, function: cst.FunctionDef) -> bool:
    """Not private, and its own body returns a value or yields."""
    if _private(function.name.value):
      return False
    if function not in self._hands_back:
      found = function_exits.exits(function)
      self._hands_back[function] = found.yields or any(
          r.value is not None and not (isinstance(r.value, cst.Name) and r.value.value == "None")
          for r in found.returns)
    return self._hands_back[function]

  def holder(self, line: int) -> str | None:
    """The public definition holding ``line`` (``f``, ``C.method``, ``name``), or None
    where that definition is private, hands nothing back or is not a definition."""
    for statement in self._module.body:
      if line not in _lines(self._get, statement):
        continue
      if isinstance(statement, cst.FunctionDef):
        return statement.name.value if self._public_function(statement) else None
      if isinstance(statement, cst.ClassDef):
        name = statement.name.value
        if _private(name):
          return None
        for inner in statement.body.body:
          if isinstance(inner, cst.FunctionDef) and line in _lines(self._get, inner):
            return f"{name}.{inner.name.value}" if self._public_function(inner) else None
        return name
      if isinstance(statement, cst.SimpleStatementLine):
        public = [n for n in _assigned_names(statement) if not _private(n)]
        return public[0] if public else None
      return None
    return None
