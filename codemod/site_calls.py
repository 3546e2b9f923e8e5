"""How a function the file binds is called: whether only this file's calls reach it, and
whether every call of a converted site passes its arguments by position.

``calls_of`` gives the calls of a binding only this file can read (a function's local, or
a module's private ``_name``) whose every read is a call; a read that is not a call (the
value handed on, returned, wrapped in ``functools.partial``) may reach any call, so there
is no answer then. ``unreplicate`` follows a helper's parameter through those calls.

The support module's keyword-argument code (``support_module.KEYWORD_ARGUMENTS``) runs
only for calls that pass keywords, so a repository's copy can leave it out where no call
of a site does: a site called where it is made (``pmap(f)(x, y)``), or bound to a name
(or a decorated def no other decorator wraps) whose ``calls_of`` pass neither keywords
nor ``**``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import libcst as cst
from libcst.metadata import FunctionScope, GlobalScope, ScopeProvider


def calls_of(get_metadata: Callable, name: str, node: cst.CSTNode, binding: cst.CSTNode,
             calls: Mapping[cst.CSTNode, cst.Call]) -> list[cst.Call] | None:
  """The calls of ``binding`` (the binding of ``name`` at ``node``; ``calls``: each call
  of the file by its function), where only this file can read it and every read calls
  it; None where it may be read otherwise, or is never read."""
  scope = get_metadata(ScopeProvider, node, None)
  if isinstance(scope, GlobalScope):
    if not name.startswith("_"):
      return None  # other modules may call it
  elif not isinstance(scope, FunctionScope):
    return None  # a class attribute, or a comprehension's name
  ours = [a for a in scope.assignments[name] if getattr(a, "node", None) is binding]
  if len(ours) != 1:
    return None
  found = [calls.get(access.node) for access in ours[0].references]
  if not found or None in found:
    return None
  return [call for call in found if call is not None]


class SiteCalls:
  """Answers for one module, over the calls its analysis walk collected."""

  def __init__(self, get_metadata: Callable, calls: Iterable[cst.Call]) -> None:
    self._get = get_metadata
    self._calls: dict[cst.CSTNode, cst.Call] = {call.func: call for call in calls}

  def of(self, site: cst.CSTNode, statement: cst.CSTNode,
         fundef: cst.FunctionDef | None = None, outermost: bool = True
         ) -> list[cst.Call] | None:
    """Every call of the site at ``site`` (a pmap call in ``statement``, or the pmap
    decorators of ``fundef``, ``outermost`` where no other decorator wraps them): the
    call that calls it where it is made, or ``calls_of`` the name it is bound to; None
    where they cannot all be found."""
    if fundef is not None:
      if not outermost:
        return None
      return calls_of(self._get, fundef.name.value, fundef, fundef, self._calls)
    if site in self._calls:  # called where it is made
      return [self._calls[site]]
    assigned = _AssignmentOf(site)
    statement.visit(assigned)
    target = assigned.target
    return (None if target is None
            else calls_of(self._get, target.value, target, target, self._calls))

  def by_position(self, site: cst.CSTNode, statement: cst.CSTNode,
                  fundef: cst.FunctionDef | None = None, outermost: bool = True) -> bool:
    """Whether every call of the site (see ``of``) passes its arguments by position
    only."""
    found = self.of(site, statement, fundef, outermost)
    return found is not None and all(_positional(call) for call in found)


def _positional(call: cst.Call) -> bool:
  return all(arg.keyword is None and arg.star != "**" for arg in call.args)


class _AssignmentOf(cst.CSTVisitor):
  """The one name an assignment binds ``value`` to: ``name = value``."""

  def __init__(self, value: cst.CSTNode) -> None:
    self.target: cst.Name | None = None
    self._value = value

  def visit_Assign(self, node: cst.Assign) -> None:
    if (node.value is self._value and len(node.targets) == 1
        and isinstance(node.targets[0].target, cst.Name)):
      self.target = node.targets[0].target
