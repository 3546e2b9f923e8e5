"""Reaching definitions of one name at one use, within the body of its scope.

``reaching(module, get_metadata, use)`` gives the bindings of the name ``use`` reads that
may be the one it sees, following the body's statements: a binding kills the ones
before it on its path, an ``if``'s arms join, a loop's body reaches its own start (and
its ``for`` target binds afresh each time round), a ``try`` handler, a ``finally`` or the
code after a ``with`` may start from any point of the code they cover, and
``break`` / ``continue`` / ``return`` / ``raise`` are followed both where they jump and
as if they fell through (more bindings than can reach is always safe for the callers,
which only act where every binding is one they know). Nested function, class and lambda
bodies are other scopes and are not entered.

The answer is None where the name's value cannot be followed this way: a use in a
comprehension, lambda or annotation scope, a ``global`` / ``nonlocal`` name, a name of
an enclosing scope or a builtin, or a binding the walk does not see (``nonlocal``
assignments from a nested function, ``global`` ones in a function for a module's name).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import ClassScope, FunctionScope, GlobalScope, ScopeProvider

from codemod import together

State = frozenset[cst.CSTNode]


@dataclass(frozen=True)
class Reaching:
  """The bindings that may reach a use: assignment and ``for`` / ``with`` / ``except`` /
  walrus / ``del`` / match-capture target names, parameters, imports and defs (the nodes
  libcst's scope analysis records, where it records them). ``outside``: a module or class
  body's name may also hold, at the use, what it held before the body bound it (a
  builtin, a star import's). A function's local read where no binding reached it raises
  NameError, whatever it is used for: such paths add nothing."""
  bindings: frozenset[cst.CSTNode]
  outside: bool


_ENTRY = cst.Name("_")  # a module or class body's name before the body binds it


def reaching(module: cst.Module, get_metadata: Callable, use: cst.Name) -> Reaching | None:
  """The bindings of ``use``'s name that may reach it, or None (see the module's doc)."""
  scope = get_metadata(ScopeProvider, use, None)
  if isinstance(scope, GlobalScope):
    owner: cst.CSTNode = module
    body: Sequence[cst.CSTNode] = module.body
  elif isinstance(scope, (FunctionScope, ClassScope)) and isinstance(
      scope.node, (cst.FunctionDef, cst.ClassDef)):
    owner = scope.node
    body = scope.node.body.body
  else:
    return None
  name = use.value
  referents = {r for access in scope.accesses[use] for r in access.referents}
  if not referents or any(r.scope is not scope for r in referents):
    return None  # global, nonlocal, an enclosing scope's or a builtin
  walk = _Walk(name, _path(owner, use))
  entry: State = frozenset([_ENTRY])
  if isinstance(owner, cst.FunctionDef):
    entry = walk.bind(_params(owner.params, name))
  walk.block(body, entry)
  if walk.unknown or walk.at_use is None:
    return None
  recorded = {a.node for a in scope.assignments[name]}
  if not recorded <= walk.bindings:
    return None  # bound where the walk does not look (a nested scope's nonlocal / global)
  return Reaching(walk.at_use - {_ENTRY}, _ENTRY in walk.at_use)


def _params(params: cst.Parameters, name: str) -> list[cst.CSTNode]:
  every = [*params.posonly_params, *params.params, *params.kwonly_params]
  for star in (params.star_arg, params.star_kwarg):
    if isinstance(star, cst.Param):
      every.append(star)
  return [p for p in every if p.name.value == name]


def _path(owner: cst.CSTNode, use: cst.CSTNode) -> set[cst.CSTNode]:
  """``use`` and the nodes holding it, up to ``owner``."""
  finder = _PathFinder(use)
  together.walk(owner, [finder])
  return set(finder.found)


class _PathFinder(cst.CSTVisitor):

  def __init__(self, use: cst.CSTNode):
    self.use = use
    self.stack: list[cst.CSTNode] = []
    self.found: list[cst.CSTNode] = []

  def on_visit(self, node: cst.CSTNode) -> bool:
    if self.found:
      return False
    self.stack.append(node)
    if node is self.use:
      self.found = list(self.stack)
      return False
    return True

  def on_leave(self, original_node: cst.CSTNode) -> None:
    if self.stack and self.stack[-1] is original_node:
      self.stack.pop()


def _targets(target: cst.BaseExpression, name: str) -> list[cst.CSTNode]:
  """The names ``target`` binds that are ``name`` (attributes and subscripts bind none)."""
  if isinstance(target, cst.Name):
    return [target] if target.value == name else []
  if isinstance(target, (cst.Tuple, cst.List)):
    return [n for element in target.elements for n in _targets(element.value, name)]
  if isinstance(target, cst.StarredElement):
    return _targets(target.value, name)
  return []


class _Walruses(cst.CSTVisitor):
  """``name := ...`` in code of the scope: in comprehensions too (they bind in the
  enclosing scope), not in lambda or def bodies; match captures of ``name``."""

  def __init__(self, name: str):
    self.name = name
    self.found: list[cst.CSTNode] = []

  def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
    self.found.extend(_targets(node.target, self.name))

  def visit_Lambda(self, node: cst.Lambda) -> bool:
    together.walk(node.params, [self])  # defaults run here
    return False

  def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
    for part in (*node.decorators, node.params, node.returns):
      if part is not None:
        together.walk(part, [self])
    return False

  def visit_ClassDef(self, node: cst.ClassDef) -> bool:
    for part in (*node.decorators, *node.bases, *node.keywords):
      together.walk(part, [self])
    return False

  def visit_MatchAs(self, node: cst.MatchAs) -> None:
    if node.name is not None:
      self.found.extend(_targets(node.name, self.name))

  def visit_MatchStar(self, node: cst.MatchStar) -> None:
    if node.name is not None:
      self.found.extend(_targets(node.name, self.name))

  def visit_MatchMapping(self, node: cst.MatchMapping) -> None:
    if node.rest is not None:
      self.found.extend(_targets(node.rest, self.name))


@dataclass
class _Loop:
  breaks: set[cst.CSTNode] = field(default_factory=set)
  continues: set[cst.CSTNode] = field(default_factory=set)


class _Walk:
  """The states (bindings that may hold) through one body, for one name and one use."""

  def __init__(self, name: str, around: set[cst.CSTNode]):
    self.name = name
    self.around = around  # the use and what holds it
    self.at_use: State | None = None
    self.unknown = False
    self.bindings: set[cst.CSTNode] = set()  # every binding seen
    self.loops: list[_Loop] = []
    self.covers: list[set[cst.CSTNode]] = []  # states seen inside a try / with, open ones

  def _use(self, state: Iterable[cst.CSTNode]) -> None:
    self.at_use = frozenset(state) | (self.at_use or frozenset())

  def _note(self, state: State) -> State:
    for cover in self.covers:
      cover.update(state)
    return state

  def bind(self, nodes: Iterable[cst.CSTNode]) -> State:
    found = frozenset(nodes)
    self.bindings.update(found)
    return found

  def _walrus(self, *parts: cst.CSTNode | None) -> State:
    finder = _Walruses(self.name)
    for part in parts:
      if part is not None:
        together.walk(part, [finder])
    return self.bind(finder.found)

  def _header(self, state: State, *parts: cst.CSTNode | None) -> State:
    """The state after evaluating ``parts``, noting the use if it is in them."""
    state = state | self._walrus(*parts)
    if any(part in self.around for part in parts if part is not None):
      self._use(state)
    return self._note(state)

  def block(self, body: Sequence[cst.CSTNode], state: State) -> State:
    self._note(state)
    for statement in body:
      state = self._note(self.statement(statement, state))
    return state

  def _suite(self, suite: cst.BaseSuite | None, state: State) -> State:
    if suite is None:
      return state
    return self.block(suite.body, state)

  def statement(self, node: cst.CSTNode, state: State) -> State:
    if isinstance(node, cst.SimpleStatementLine):
      return self.block(node.body, state)
    if isinstance(node, cst.BaseSmallStatement):
      return self._small(node, state)
    if isinstance(node, cst.If):
      state = self._header(state, node.test)
      out = self._suite(node.body, state)
      if isinstance(node.orelse, cst.If):
        return out | self.statement(node.orelse, state)
      return out | self._suite(node.orelse.body if node.orelse else None, state)
    if isinstance(node, cst.While):
      return self._loop(state, lambda head: self._header(head, node.test), node.body,
                        node.orelse)
    if isinstance(node, cst.For):
      state = self._header(state, node.iter)
      bound = self.bind(_targets(node.target, self.name))
      return self._loop(state, lambda head: self._note(bound or head), node.body,
                        node.orelse, exhausted=lambda head: head)
    if isinstance(node, cst.With):
      for item in node.items:
        state = self._header(state, item.item)
        if item.asname is not None:
          state = self._note(self.bind(_targets(item.asname.name, self.name)) or state)
      cover: set[cst.CSTNode] = set()
      self.covers.append(cover)
      out = self._suite(node.body, state)
      self.covers.pop()
      return out | cover  # a context manager may swallow an exception from any point
    if isinstance(node, (cst.Try, cst.TryStar)):
      return self._try(node, state)
    if isinstance(node, cst.Match):
      state = self._header(state, node.subject)
      out = state
      for case in node.cases:
        state = self._header(state, case.pattern, case.guard)  # captures, failed ones too
        out |= self._suite(case.body, state)
      return out
    if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
      state = self._header(state, node)  # decorators, defaults, bases (not the body)
      return self.bind([node]) if node.name.value == self.name else state
    self.unknown = True  # a statement this walk does not know
    return state

  def _small(self, node: cst.BaseSmallStatement, state: State) -> State:
    walruses = self._walrus(node)
    if node in self.around:
      self._use(state | walruses)
    bound: list[cst.CSTNode] = []
    if isinstance(node, cst.Assign):
      bound = [n for target in node.targets for n in _targets(target.target, self.name)]
    elif isinstance(node, (cst.AnnAssign, cst.AugAssign)):
      if not isinstance(node, cst.AnnAssign) or node.value is not None:
        bound = _targets(node.target, self.name)
    elif isinstance(node, cst.Del):
      bound = _targets(node.target, self.name)  # unbound after it: not a value anyone knows
    elif isinstance(node, (cst.Import, cst.ImportFrom)):
      if isinstance(node.names, cst.ImportStar):
        return self.bind([node]) | state | walruses  # may bind any name
      for alias in node.names:
        named: cst.BaseExpression = alias.asname.name if alias.asname is not None else alias.name
        while isinstance(named, cst.Attribute):  # import a.b binds a
          named = named.value
        if isinstance(named, cst.Name) and named.value == self.name:
          bound = [node]
    elif isinstance(node, (cst.Global, cst.Nonlocal)):
      if any(n.name.value == self.name for n in node.names):
        self.unknown = True
    elif isinstance(node, cst.Break) and self.loops:
      self.loops[-1].breaks.update(state)
    elif isinstance(node, cst.Continue) and self.loops:
      self.loops[-1].continues.update(state)
    if bound:
      return self.bind(bound) | walruses
    return state | walruses

  def _loop(self, state: State, enter: Callable[[State], State], body: cst.BaseSuite,
            orelse: cst.Else | None, exhausted: Callable[[State], State] | None = None
            ) -> State:
    """A loop whose body starts from ``enter(head)``, ``head`` being what reaches its
    start (from before it, its body's end and its continues); it ends from
    ``exhausted(head)`` (a ``for``: the target not rebound), or from what ``enter`` gives
    (a ``while``: its test evaluated), and from its breaks."""
    loop = _Loop()
    self.loops.append(loop)
    head = state
    while True:  # bindings only accumulate: this ends
      entered = enter(head)
      out = self._suite(body, entered)
      grown = head | out | loop.continues
      if grown == head:
        break
      head = grown
    self.loops.pop()
    done = exhausted(head) if exhausted is not None else enter(head)
    return self._suite(orelse.body if orelse else None, done) | loop.breaks

  def _try(self, node: cst.Try | cst.TryStar, state: State) -> State:
    cover: set[cst.CSTNode] = set(state)
    self.covers.append(cover)
    out = self._suite(node.body, state)
    self.covers.pop()
    caught = frozenset(cover)  # a handler may start from any point of the body
    later: set[cst.CSTNode] = set()  # for the finally: any point after the body too
    self.covers.append(later)
    ends = [self._suite(node.orelse.body if node.orelse else None, out)]
    for handler in node.handlers:
      entered = self._header(caught, handler.type)
      if handler.name is not None:
        entered = self._note(self.bind(_targets(handler.name.name, self.name)) or entered)
      ends.append(self._suite(handler.body, entered))
    self.covers.pop()
    end = frozenset().union(*ends)
    if node.finalbody is None:
      return end
    end = self._suite(node.finalbody.body, end | caught | later)
    if self.loops:  # a break or continue in the try leaves through the finally
      self.loops[-1].breaks.update(end)
      self.loops[-1].continues.update(end)
    return end
