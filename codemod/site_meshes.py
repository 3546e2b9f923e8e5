"""Where a converted site's mesh is built, and under which name.

A site's mesh is one statement, ``mesh = jax.sharding.Mesh(jax.devices(), ("batch",))``,
in the function that builds the pmap (the module for a site outside functions; a class
body is passed over for the function or module around it), placed before the statement
of that body that holds the site; where one branch of that statement (an if's, a with's or
a try's block) holds all the mesh's sites, before the first statement there that holds
one, and so on down (a loop's body is not entered). Building it there, not at the top of
the module, keeps a converted library from starting JAX's backend when it is imported
(which would come before a program's ``jax.distributed.initialize``). Sites of one body with the same
literal axis names (or module names bound once: a constant, an import) share one mesh, built
before the first of them, and a pmap without ``axis_name`` (an axis its function cannot
name) runs on the body's first mesh over ``jax.devices()``, where there is one (sites
with named axes are planned first). A shared mesh spans ``pmap_devices(rows=n)`` instead
where the body places its inputs on ``n`` devices itself (``placed_devices``). An axis
name that is not a literal (a variable), pmap's
``devices=`` / ``backend=`` / ``axis_size=`` (the mesh then spans those devices,
``jax.devices(backend)``, the first ``axis_size`` of them), or a site called where it is
made on names (``pmap_devices(x)``: as many devices as ``x`` has rows), gets its mesh
just before its own statement, where those values hold (``hoistable`` says where they would not: then
the site keeps the form whose mesh is built on its first call); sites of one function whose
``devices=`` is the same name of its own, which no statement from the first to the last
binds or hands to a call, share the first one's. The name is ``mesh``
(``<axis>_mesh`` in a file whose sites use several axis names, in lower case for a
constant) unless the file already uses that identifier, then the other one, then a
numbered one.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import libcst as cst
from libcst.metadata import (BuiltinAssignment, ComprehensionScope, FunctionScope, GlobalScope,
                              ImportAssignment, PositionProvider, ScopeProvider)

from codemod import edits, file_style, placed_devices, together
from codemod.axes_to_specs import Unconvertible

MESH = "jax.sharding.Mesh"


@dataclass
class _Specs:
  """A site's in_specs, bound to a name that placed_on and shard_map both read."""
  name: str
  source: str


@dataclass
class _Mesh:
  name: str
  axes: tuple[str, ...]  # the axis names' source
  owner: cst.CSTNode  # the Module or FunctionDef whose body gets the statement
  devices: str  # the source of the mesh's device list
  lazy: bool = False  # a cached function making it, called on the sites' first call
  statements: list[cst.BaseStatement] = field(default_factory=list)  # its sites' statements
  sites: list[cst.CSTNode] = field(default_factory=list)
  comments: list[str] = field(default_factory=list)  # on what its devices came from
  rows: placed_devices.Rows | None = None  # where the code gave its devices


class MeshPlan:
  """The meshes the converted sites of one module use."""

  def __init__(self, module: cst.Module, get_metadata: Callable[..., Any],
               identifiers: set[str], by_axis: bool = False, cache: str = "functools.cache",
               placed: placed_devices.PlacedDevices | None = None,
               sites: Sequence[cst.CSTNode] = (),
               feeds: Callable[[cst.CSTNode, cst.BaseStatement],
                               placed_devices.Feed | None] | None = None):
    self._module = module
    self._placed = placed  # how many devices a function's own code places inputs on
    self._sites = sites  # every site of the module, planned or not
    self._feeds = feeds  # a site's calls and the positions it maps over axis 0
    self._by_axis = by_axis  # several axis names in the file: name each mesh after its axis
    self._cache = cache  # how the file names functools.cache, for a lazy mesh
    self._get = get_metadata
    self._taken = set(identifiers)  # every identifier the file's code uses
    self._meshes: dict[tuple, _Mesh] = {}
    self._before: dict[cst.CSTNode, list[_Mesh | _Specs]] | None = None
    self._specs: dict[cst.BaseStatement, list[_Specs]] = {}  # by the statement they go before
    self._places: dict[cst.CSTNode, tuple[cst.CSTNode, cst.BaseStatement]] = {}
    self._of_site: dict[cst.CSTNode, _Mesh] = {}

  def mesh_for(self, node: cst.CSTNode, axes: list[str], literal: bool,
               devices: str | None = None, lazy: bool = False, own: bool = False) -> str:
    """The name of the mesh the site at ``node`` (a call, or a def's decorator) runs on:
    over ``jax.devices()``, or over ``devices`` (source of pmap's ``devices=`` list, or
    ``jax.devices(backend)``), evaluated where the mesh is built (``hoistable``); a
    ``lazy`` one is a function, cached (``@functools.cache``), over that statement's
    value. An ``own`` mesh (over the rows of the site's call) is built right before the
    innermost statement holding the site, and shared with no site of another."""
    owner, statement = self._place(node)
    shared = literal and devices is None
    at = self._innermost(statement, [node]) if own else statement
    key = (id(owner) if shared else id(at), tuple(axes), devices, lazy)
    if literal and devices is not None and not lazy:
      key = self._same_devices(owner, statement, tuple(axes), devices) or key
    mesh = self._meshes.get(key)
    if mesh is None:
      rows = self._placed_rows(owner, statement) if shared and not lazy else None
      mesh = self._meshes[key] = _Mesh(
          self._name(owner, axes), tuple(axes), owner,
          devices or (f"pmap_devices(rows={rows.count})" if rows else "jax.devices()"),
          lazy, rows=rows)
    mesh.statements.append(statement)
    mesh.sites.append(node)
    self._of_site[node] = mesh
    self._before = None
    return mesh.name

  def specs_name(self, node: cst.CSTNode, source: str, made: str = "") -> str:
    """The name the site at ``node`` reads its in_specs (``source``) by: bound just before
    the innermost statement holding the site (``_innermost``), after a mesh built there,
    and named after what the site makes (``made``, a def's name, else the target of the
    assignment holding it: ``<made>_specs``, private at module level)."""
    owner, statement = self._place(node)
    first = self._innermost(statement, [node])
    made = (made or _made_name(first, node, self._inside)).lstrip("_") or "in"
    prefix = "_" if isinstance(owner, cst.Module) else ""
    named = {specs.name for held in self._specs.values() for specs in held}
    for name in [f"{prefix}{made}_specs"] + [f"{prefix}{made}_specs_{i}" for i in range(2, 100)]:
      if name not in self._taken and name not in named:
        self._specs.setdefault(first, []).append(_Specs(name, source))
        self._before = None
        return name
    raise Unconvertible("no free name for the site's in_specs")

  def _same_devices(self, owner: cst.CSTNode, statement: cst.BaseStatement,
                    axes: tuple[str, ...], devices: str) -> tuple | None:
    """The key of a mesh another statement of ``owner`` (a function) has over the same
    ``devices``, a name of the function's own that no statement from the first of theirs
    to the last binds, hands to a call or calls a method on: that mesh holds the list
    this site's pmap would get."""
    if not devices.isidentifier() or not isinstance(owner, cst.FunctionDef):
      return None
    scope = self._get(ScopeProvider, statement, None)
    if scope is None or not any(a.scope is scope for a in scope[devices]):
      return None
    body = list(owner.body.body)
    for key, mesh in self._meshes.items():
      held = [*mesh.statements, statement]
      if (mesh.owner is not owner or mesh.axes != axes or mesh.devices != devices
          or mesh.lazy or not all(h in body for h in held)):
        continue
      # Built before the first of them, the mesh must mean the same up to the last.
      at = sorted(body.index(h) for h in held)
      between = body[at[0]:at[-1]]
      handed = _Handed(*self._sites)  # pmap's own devices= hands it to no one
      for each in between:
        each.visit(handed)
      if devices in handed.found or any(
          isinstance(a.node, cst.CSTNode) and any(self._inside(a.node, s) for s in between)
          for a in scope[devices]):
        return None
      return key
    return None

  def devices_of(self, node: cst.CSTNode) -> tuple[str, placed_devices.Rows | None]:
    """The source of the device list of the site's mesh, and the rows the code gives
    its inputs where those gave it (``placed_devices``)."""
    mesh = self._of_site[node]
    return mesh.devices, mesh.rows

  def _placed_rows(self, owner: cst.CSTNode, statement: cst.BaseStatement
                   ) -> placed_devices.Rows | None:
    """How many devices the code of ``owner`` places its inputs on, or makes its sites'
    inputs rows for, where that holds before the first of its statements holding a site
    (where its shared mesh goes)."""
    if self._placed is None:
      return None
    firsts = [self._line(statement)]
    owned = []
    for site in self._sites:
      try:
        place = self._place(site)
      except Unconvertible:
        continue
      if place[0] is owner:
        firsts.append(self._line(place[1]))
        owned.append((site, place[1]))
    scope = self._get(ScopeProvider, statement, None)
    rows = self._placed.rows(scope, min(firsts))
    if rows is None and self._feeds is not None:
      feeds = [self._feeds(site, held) for site, held in owned]
      if None not in feeds:
        rows = self._placed.rows_fed([f for f in feeds if f is not None], scope, min(firsts))
    return rows

  def joinable(self, node: cst.CSTNode) -> tuple[str, ...] | None:
    """The axis of the first mesh over ``jax.devices()`` already planned in the body that
    builds the site at ``node``, one with a single literal axis (built before its first
    site, so before this one too): a site whose axis has no name its function could
    read runs on it as well as on a mesh of its own. None where there is none."""
    try:
      owner = self._place(node)[0]
    except Unconvertible:
      return None
    for (place, axes, devices, lazy) in self._meshes:
      if place == id(owner) and devices is None and not lazy and len(axes) == 1:
        return axes
    return None

  def comment(self, node: cst.CSTNode, comments: list[str]) -> None:
    """Comments the user wrote on the site's ``devices=`` / ``backend=``: they go with
    the mesh statement that now says it (after it when one fits there, else above)."""
    self._of_site[node].comments.extend(comments)

  def hoistable(self, node: cst.CSTNode, value: cst.CSTNode, mutable: bool = True,
                own: bool = False) -> bool:
    """Whether ``value``, part of the site at ``node``, means the same before the
    statement holding the site, where the mesh is built: it is in that statement's scope
    (no comprehension or lambda of it), the statement binds none of the names it reads
    (in a block, a loop, a walrus) before the site runs (``state, out = site(state)``
    binds after), and, for a ``mutable`` value (a device list), none of them is handed to
    a call or has a method called on it elsewhere in the statement. For the site's
    ``own`` mesh (``mesh_for``), the statement is the innermost one holding the site."""
    try:
      statement = self._place(node)[1]
    except Unconvertible:
      return False
    statement = self._innermost(statement, [node]) if own else statement
    scope = self._get(ScopeProvider, value, None)
    if scope is None or scope is not self._get(ScopeProvider, statement, None):
      return False
    reads = _Names()
    value.visit(reads)
    after = _assigned_after(statement)
    for name in reads.found:
      if any(not isinstance(a, (ImportAssignment, BuiltinAssignment))
             and isinstance(a.node, cst.CSTNode) and self._get(PositionProvider, a.node, None)
             and self._inside(a.node, statement)
             and not any(self._inside(a.node, target) for target in after)
             for a in scope[name]):
        return False
    if not mutable:
      return True
    handed = _Handed(node)
    statement.visit(handed)
    return not reads.found & handed.found

  def statement(self, node: cst.CSTNode) -> cst.BaseStatement | None:
    """The statement of its owner's body that holds the site at ``node``."""
    try:
      return self._place(node)[1]
    except Unconvertible:
      return None

  def caller(self, node: cst.CSTNode) -> cst.Call | None:
    """The call that calls the site at ``node`` where it is made: ``pmap(f)(x)``."""
    try:
      statement = self._place(node)[1]
    except Unconvertible:
      return None
    found = _CallOf(node)
    statement.visit(found)
    return found.call

  def at_module_level(self, node: cst.CSTNode) -> bool:
    """Whether the site at ``node`` would get its mesh at module level."""
    try:
      return isinstance(self._place(node)[0], cst.Module)
    except Unconvertible:
      return False

  def built_at_import(self, node: cst.CSTNode) -> bool:
    """Whether importing the module builds the site at ``node``: at module level, and not
    in a lambda, whose body runs when it is called."""
    return (self.at_module_level(node)
            and not isinstance(self._get(ScopeProvider, node, None), FunctionScope))

  def device_lists(self) -> list[str]:
    """The source of each mesh's device list (for the imports)."""
    return [mesh.devices for mesh in self._meshes.values()]

  def decorators(self) -> list[str]:
    """The source of the decorators the mesh statements carry (for the imports)."""
    return [f"@{self._cache}" for mesh in self._meshes.values() if mesh.lazy]

  def where(self, node: cst.CSTNode) -> str:
    """For the report: a note when the site's mesh is built at import, or made on the
    first call."""
    if node in self._of_site and self._of_site[node].lazy:
      return ("; at module level in a library module or a program that calls "
              "jax.distributed.initialize: the site and its mesh are made on its first call, "
              "not when the module is imported")
    if not self.at_module_level(node) or self._under_main_guard(node):
      return ""
    return ("; the mesh is built when the module is imported, which starts JAX's backend "
            "(a program calling jax.distributed.initialize does so before importing it)")

  def _under_main_guard(self, node: cst.CSTNode) -> bool:
    """Whether the site's mesh goes into an ``if __name__ == "__main__":`` block, which
    importing the module does not run."""
    top = self._place(node)[1]
    mesh = self._of_site.get(node)
    if mesh is None or mesh.lazy or not isinstance(top, cst.If):
      return False
    test = top.test
    return (isinstance(test, cst.Comparison) and isinstance(test.left, cst.Name)
            and test.left.value == "__name__" and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.Equal)
            and isinstance(test.comparisons[0].comparator, cst.SimpleString)
            and test.comparisons[0].comparator.evaluated_value == "__main__"
            and self._inside(self._innermost(top, mesh.sites), top.body))

  def evaluated_again(self, node: cst.CSTNode) -> str | None:
    """Where the site at ``node`` is built again each time it runs (a loop or a
    comprehension in its function), None where nothing says so."""
    if isinstance(self._get(ScopeProvider, node, None), ComprehensionScope):
      return "in a comprehension"
    loops = _Loops()
    together.walk(self._place(node)[1], [loops])
    if any(self._inside(node, loop.body) for loop in loops.found):
      return "in a loop"
    return None

  def has_statements_before(self, original: cst.CSTNode) -> bool:
    """Whether mesh statements go before ``original`` (cheap: asked of every statement)."""
    return original in self._firsts()

  def _firsts(self) -> dict[cst.CSTNode, list[_Mesh | _Specs]]:
    if self._before is None:
      self._before = {}
      for mesh in self._meshes.values():
        first = min(mesh.statements, key=self._line)
        if not mesh.lazy:  # a def making the mesh stays in the owner's body
          first = self._innermost(first, mesh.sites)
        self._before.setdefault(first, []).append(mesh)
      for statement, held in self._specs.items():
        self._before.setdefault(statement, []).extend(held)
    return self._before

  def _innermost(self, statement: cst.BaseStatement, sites: list[cst.CSTNode]
                 ) -> cst.BaseStatement:
    """The statement the mesh goes before: ``statement``, or, where one branch of it (of
    an if, with or try) holds all the mesh's sites, the first statement there that holds
    one, and so on down. A loop's body is not entered: the mesh is built once, before
    it."""
    while True:
      block = next((b for b in _blocks(statement)
                    if all(self._inside(site, b) for site in sites)), None)
      if block is None:
        return statement
      holding = [st for st in block.body if any(self._inside(site, st) for site in sites)]
      statement = holding[0]
      if len(holding) > 1:
        return statement

  def statements_before(self, original: cst.CSTNode, style: file_style.FileStyle,
                        indent: int) -> list[cst.BaseStatement]:
    """The mesh statements (and named in_specs) that go before ``original`` (a statement
    of the source)."""
    out: list[cst.BaseStatement] = []
    for mesh in self._firsts().get(original, ()):
      if isinstance(mesh, _Specs):  # a site's in_specs, after the meshes
        specs = mesh
        value = edits.render(edits.breakable(specs.source), indent + len(specs.name) + 3,
                             indent, style)
        out.append(edits.parse_simple_statement(f"{specs.name} = {value}\n"))
        continue
      axes = f"({', '.join(mesh.axes)},)" if len(mesh.axes) == 1 else f"({', '.join(mesh.axes)})"
      # pmap_devices(...) is generated from names, so it may break like generated code.
      devices = (edits.breakable(mesh.devices) if mesh.devices.startswith("pmap_devices(")
                 else mesh.devices)
      call = edits.Call(MESH, (devices, axes))
      if mesh.lazy:
        inner = indent + len(style.unit)
        text = (f"@{self._cache}\ndef {mesh.name}():\n{' ' * inner}return "
                + edits.render(call, inner + 7, inner, style))
      else:
        text = f"{mesh.name} = " + edits.render(call, indent + len(mesh.name) + 3, indent, style)
      above, after = list(mesh.comments), ""
      last = text.rsplit("\n", 1)[-1]
      if above and (indent if "\n" not in text else 0) + len(last) + 2 + len(
          above[-1]) <= style.width:
        after = "  " + above.pop()
      statement = (cst.parse_statement(text + after + "\n") if mesh.lazy
                   else edits.parse_simple_statement(text + after + "\n"))
      out.append(statement.with_changes(leading_lines=[
          cst.EmptyLine(indent=True, comment=cst.Comment(c)) for c in above]))
    return out

  def _line(self, statement: cst.CSTNode) -> int:
    decorators = getattr(statement, "decorators", ())
    return self._get(PositionProvider, decorators[0] if decorators else statement).start.line

  def _owner(self, node: cst.CSTNode) -> cst.CSTNode:
    scope = self._get(ScopeProvider, node, None)
    while scope is not None and not (
        isinstance(scope, GlobalScope)
        or (isinstance(scope, FunctionScope) and isinstance(scope.node, cst.FunctionDef))):
      scope = scope.parent
    if scope is None:
      raise Unconvertible("the site's scope could not be read")
    owner = self._module if isinstance(scope, GlobalScope) else scope.node
    if isinstance(owner, cst.FunctionDef) and not isinstance(owner.body, cst.IndentedBlock):
      raise Unconvertible("the site's def has its body on the def line, where its mesh "
                          "statement cannot go")
    return owner

  def _place(self, node: cst.CSTNode) -> tuple[cst.CSTNode, cst.BaseStatement]:
    """(owner, the statement of the owner's body holding ``node``), found once per site."""
    if node not in self._places:
      owner = self._owner(node)
      body = owner.body if isinstance(owner, cst.Module) else owner.body.body  # type: ignore[attr-defined]
      statement = next((st for st in body if self._inside(node, st)), None)
      if statement is None:
        raise Unconvertible("the statement holding the site could not be found")
      self._places[node] = (owner, statement)
    return self._places[node]

  def _inside(self, node: cst.CSTNode, outer: cst.CSTNode) -> bool:
    """Whether ``node`` lies in ``outer``'s source span (a def's from its decorators)."""
    start = self._get(PositionProvider, node).start
    span = self._get(PositionProvider, outer)
    first = self._line(outer)
    return ((first, 0) <= (start.line, start.column)
            and (start.line, start.column) < (span.end.line, span.end.column))

  def _name(self, owner: cst.CSTNode, axes: list[str]) -> str:
    used = {m.name for m in self._meshes.values() if m.owner is owner}
    # An axis given by a constant (_PMAP_AXIS_NAME) names its mesh in lower case.
    axis = re.sub(r"\W", "", axes[0].strip("'\"")) if len(axes) == 1 else ""
    axis = axis.lower().strip("_") if axis.isupper() else axis
    candidates = ["mesh"] + ([f"{axis}_mesh"] if axis.isidentifier() else [])
    if self._by_axis and len(candidates) > 1:
      candidates.reverse()
    candidates += [f"mesh_{i}" for i in range(2, 100)]
    for name in candidates:
      if name not in self._taken and name not in used:
        return name
    raise Unconvertible("no free name for the site's mesh")


def _blocks(statement: cst.CSTNode) -> list[cst.IndentedBlock]:
  """The indented blocks of an if (with its elif and else), with or try statement."""
  blocks: list[cst.BaseSuite] = []
  if isinstance(statement, cst.If):
    branch: cst.If | cst.Else | None = statement
    while isinstance(branch, cst.If):
      blocks.append(branch.body)
      branch = branch.orelse
    if branch is not None:
      blocks.append(branch.body)
  elif isinstance(statement, (cst.With, cst.Try)):
    blocks.append(statement.body)
  return [b for b in blocks if isinstance(b, cst.IndentedBlock)]


class _Names(cst.CSTVisitor):
  """The names in a tree (the attribute names after a dot are not names)."""

  def __init__(self) -> None:
    self.found: set[str] = set()

  def on_visit(self, node: cst.CSTNode) -> bool:
    if isinstance(node, cst.Name):
      self.found.add(node.value)
    if isinstance(node, cst.Attribute):
      node.value.visit(self)
      return False
    return True


class _Handed(cst.CSTVisitor):
  """The names a tree passes to calls or calls methods on (which may change what they
  hold), outside ``skip``."""

  def __init__(self, *skip: cst.CSTNode) -> None:
    self.found: set[str] = set()
    self._skip = skip

  def on_visit(self, node: cst.CSTNode) -> bool:
    if any(node is skipped for skipped in self._skip):
      return False
    if isinstance(node, cst.Call):
      func = node.func
      if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name):
        self.found.add(func.value.value)
      self.found.update(a.value.value for a in node.args if isinstance(a.value, cst.Name))
    return True


class _CallOf(cst.CSTVisitor):
  """The call whose function is ``fun``."""

  def __init__(self, fun: cst.CSTNode) -> None:
    self.call: cst.Call | None = None
    self._fun = fun

  def visit_Call(self, node: cst.Call) -> bool:
    if node.func is self._fun:
      self.call = node
    return self.call is None


class _Loops(cst.CSTVisitor):
  def __init__(self) -> None:
    self.found: list[cst.For | cst.While] = []

  def visit_For(self, node: cst.For) -> None:
    self.found.append(node)

  def visit_While(self, node: cst.While) -> None:
    self.found.append(node)


def _made_name(statement: cst.BaseStatement, node: cst.CSTNode,
               inside: Callable[[cst.CSTNode, cst.CSTNode], bool]) -> str:
  """The name the statement holding the site at ``node`` gives what the site makes: the
  one target's (``self.step`` -> ``step``) of an assignment whose value holds it; ""
  where there is none."""
  if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
    return ""
  small = statement.body[0]
  if not (isinstance(small, cst.Assign) and len(small.targets) == 1
          and inside(node, small.value)):
    return ""
  target = small.targets[0].target
  return (target.value if isinstance(target, cst.Name)
          else target.attr.value if isinstance(target, cst.Attribute) else "")


def _assigned_after(statement: cst.CSTNode) -> list[cst.CSTNode]:
  """The targets of a line holding one assignment, which it binds after its value runs."""
  if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
    return []
  small = statement.body[0]
  if isinstance(small, cst.Assign):
    return [t.target for t in small.targets]
  return [small.target] if isinstance(small, (cst.AugAssign, cst.AnnAssign)) else []
