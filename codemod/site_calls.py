"""How a converted site is called: whether every call passes its arguments by position.

The support module's keyword-argument code (``support_module.KEYWORD_ARGUMENTS``) runs
only for calls that pass keywords, so a repository's copy can leave it out where no call
of a site does. That holds for a site called where it is made (``pmap(f)(x, y)``), and
for one bound to a name only this file can read (a function's local, or a module's
private ``_name``, or a decorated def of either kind) whose every read is a call with
neither keywords nor ``**``. A read that is not a call (the site handed on, returned,
wrapped in ``functools.partial``) may reach a keyword call: no proof then.
"""
from __future__ import annotations

from collections.abc import Callable

import libcst as cst
from libcst.metadata import FunctionScope, GlobalScope, ScopeProvider


class SiteCalls:
  """The calls of one module, read on the first question."""

  def __init__(self, module: cst.Module, get_metadata: Callable) -> None:
    self._module = module
    self._get = get_metadata
    self._calls: dict[cst.CSTNode, cst.Call] | None = None  # call by its func node

  def by_position(self, site: cst.CSTNode, statement: cst.CSTNode,
                  fundef: cst.FunctionDef | None = None, outermost: bool = True) -> bool:
    """Whether every call of the site at ``site`` (a pmap call in ``statement``, or the
    pmap decorators of ``fundef``, ``outermost`` where no other decorator wraps them)
    passes its arguments by position only."""
    calls = self._all_calls()
    if fundef is not None:
      return outermost and self._called_by_position(fundef.name.value, fundef, fundef)
    immediate = calls.get(site)
    if immediate is not None:
      return _positional(immediate)
    found = _AssignmentOf(site)
    statement.visit(found)
    if found.target is None:
      return False
    return self._called_by_position(found.target.value, found.target, found.target)

  def _called_by_position(self, name: str, node: cst.CSTNode, binding: cst.CSTNode) -> bool:
    """Whether every read of ``binding`` (of ``name``, at ``node``) calls it by position."""
    scope = self._get(ScopeProvider, node, None)
    if isinstance(scope, GlobalScope):
      if not name.startswith("_"):
        return False  # other modules may call it
    elif not isinstance(scope, FunctionScope):
      return False  # a class attribute, or a comprehension's name
    ours = [a for a in scope.assignments[name] if getattr(a, "node", None) is binding]
    if len(ours) != 1:
      return False
    reads = [access.node for access in ours[0].references]
    calls = self._all_calls()
    return bool(reads) and all(
        read in calls and _positional(calls[read]) for read in reads)

  def _all_calls(self) -> dict[cst.CSTNode, cst.Call]:
    if self._calls is None:
      found = _Calls()
      self._module.visit(found)
      self._calls = found.by_func
    return self._calls


def _positional(call: cst.Call) -> bool:
  return all(arg.keyword is None and arg.star != "**" for arg in call.args)


class _Calls(cst.CSTVisitor):
  def __init__(self) -> None:
    self.by_func: dict[cst.CSTNode, cst.Call] = {}

  def visit_Call(self, node: cst.Call) -> None:
    self.by_func[node.func] = node


class _AssignmentOf(cst.CSTVisitor):
  """The one name an assignment binds ``value`` to: ``name = value``."""

  def __init__(self, value: cst.CSTNode) -> None:
    self.target: cst.Name | None = None
    self._value = value

  def visit_Assign(self, node: cst.Assign) -> None:
    if (node.value is self._value and len(node.targets) == 1
        and isinstance(node.targets[0].target, cst.Name)):
      self.target = node.targets[0].target
