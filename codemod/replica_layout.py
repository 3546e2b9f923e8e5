"""Lays out the values a converted site is given replicated on that site's own mesh.

``flax.jax_utils.replicate(t)`` and ``jax.device_put_replicated(t, devices)`` stack one
copy of each leaf per device. Legacy pmap took such arrays as they came. A converted site
is a ``jax.jit``, whose cache is keyed on each argument's sharding: the first step, given
the replicated state, compiled apart from every later one, given the previous step's
outputs on the site's mesh. In a file with converted sites this transform rewrites

  ``flax.jax_utils.replicate(t)`` (any import form), ``jax.device_put_replicated(t, devices)``
      ->  ``device_put_replicated(t, axis_name="batch")``,
          ``device_put_replicated(t, devices, axis_name="batch")``

(the support module's ``device_put_replicated``: the same values on the same devices,
stacked along the mesh axis named) where the call's result is passed (directly, through
a name bound to it in the same scope, or as the result of a function that returns it, such
as a ``replicate`` helper) to converted sites that map that argument's leading
axis and all name their axis "batch" (a literal, one level, no ``devices`` /
``axis_size`` / ``backend``). A call that feeds no converted site, or sites that disagree,
is left as written. Not with ``--multihost``, where sites run on the mesh of every process.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import PositionProvider, ScopeProvider

from codemod import related, site_comments, support_module
from codemod.flax_imports import FlaxImportsVisitor, last_name
from codemod.findings import Finding, Severity
from codemod.sites import Site, int_tuple, is_none

SUPPORT_NAME = "device_put_replicated"
_FLAX = frozenset({"flax.jax_utils.replicate"})
_JAX = frozenset({"jax.device_put_replicated", "jax.api.device_put_replicated"})
_LAST = frozenset({"replicate", "device_put_replicated"})
_ADVICE = frozenset({related.GUIDANCE["replicated"][1], related.GUIDANCE["replicate"][1]})
_UNSUPPORTED_OPTIONS = ("devices", "axis_size", "backend")
_MESSAGE = ("{old} rewritten to {name}(..., axis_name={axis!r}): the replicated values are "
            "laid out on the mesh of the converted site they are passed to, as its outputs "
            "are, so its jax.jit compiles once for the first step and the later ones")


@dataclass
class Rewrites:
  """The replicate calls to rewrite in one file, keyed by original Call nodes."""
  axes: dict[cst.Call, str] = field(default_factory=dict)  # call -> the site's axis name
  flax: set[cst.Call] = field(default_factory=set)  # which of them are Flax's replicate
  findings: list[Finding] = field(default_factory=list)
  flax_imports: list[tuple[str, str | None, str | None]] = field(default_factory=list)
  quote: str = '"'  # the file's
  positions: set[tuple[int, int]] = field(default_factory=set)  # of the rewritten calls

  @property
  def nodes(self) -> list[cst.CSTNode]:
    return list(self.axes)

  def code(self) -> list[str]:
    """Text of the new code (for the imports it needs)."""
    return [f"{SUPPORT_NAME}("] if self.axes else []

  def kept(self, findings: Sequence[Finding]) -> list[Finding]:
    """``findings`` without related's advice on the calls rewritten here (each has an
    entry of its own)."""
    return [f for f in findings
            if not (f.message in _ADVICE and (f.line, f.column) in self.positions)]

  def apply(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:
    axis = self.axes.get(original)  # type: ignore[call-overload]
    if axis is None:
      return updated
    return _rewritten(updated, axis, self.quote,  # type: ignore[arg-type]
                      _shift(original))  # type: ignore[arg-type]


def _shift(call: cst.Call) -> int:
  """How far the new function name moves the opening parenthesis."""
  return len(SUPPORT_NAME) - len(cst.Module([]).code_for_node(call.func))


def _rewritten(call: cst.Call, axis: str, quote: str, shift: int) -> cst.Call:
  """``f(t[, devices])`` -> ``device_put_replicated(t[, devices], axis_name=axis)``, the
  arguments and their layout as written (one per line stays one per line; lines aligned
  with the opening parenthesis move with it)."""
  args = [_moved(arg, shift) for arg in call.args] if _aligned(call) else list(call.args)
  last = args[-1]
  keyword = cst.Arg(cst.SimpleString(f"{quote}{axis}{quote}"), keyword=cst.Name("axis_name"),
                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
  if isinstance(last.comma, cst.Comma):  # a trailing comma: it stays last
    if len(args) > 1 and isinstance(args[-2].comma, cst.Comma):
      between = args[-2].comma
    else:
      between = cst.Comma(whitespace_after=call.whitespace_before_args)
    args[-1] = last.with_changes(comma=between)
    args.append(keyword.with_changes(comma=last.comma))
  else:  # the keyword goes where the call's last line break, if any, follows it
    args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
                                 whitespace_after_arg=cst.SimpleWhitespace(""))
    args.append(keyword.with_changes(whitespace_after_arg=last.whitespace_after_arg))
  return call.with_changes(func=cst.Name(SUPPORT_NAME), args=args)


def _aligned(call: cst.Call) -> bool:
  """The first argument follows the parenthesis: later lines are aligned with it."""
  return not isinstance(call.whitespace_before_args, cst.ParenthesizedWhitespace)


def _moved(arg: cst.Arg, shift: int) -> cst.Arg:
  """``arg`` with the line break after its comma indented by ``shift`` more columns."""
  comma = arg.comma
  if not (isinstance(comma, cst.Comma)
          and isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace)):
    return arg
  after = comma.whitespace_after
  indent = max(0, len(after.last_line.value) + shift)
  return arg.with_changes(comma=comma.with_changes(whitespace_after=after.with_changes(
      last_line=cst.SimpleWhitespace(" " * indent))))


def _too_long(get_metadata: Callable, call: cst.Call, new: cst.Call, width: int,
              lines: Sequence[str]) -> int | None:
  """The first line the rewritten call would make longer than ``width``, or None."""
  span = get_metadata(PositionProvider, call)
  start, end = span.start, span.end
  text = cst.Module([]).code_for_node(new).split("\n")
  text[0] = lines[start.line - 1][:start.column] + text[0]
  text[-1] += lines[end.line - 1][end.column:]
  old = lines[start.line - 1:end.line]
  for i, line in enumerate(text):
    if len(line) > width and (i >= len(old) or len(line) > len(old[i])):
      return start.line + i
  return None


def collector(get_metadata: Callable, text: str) -> cst.CSTVisitor | None:
  """The visitor ``plan`` needs to have walked the module (None: ``text`` holds nothing
  it looks for), for a caller that walks it with others."""
  return _Walk(get_metadata) if "replicate" in text else None


def plan(module: cst.Module, get_metadata: Callable, sites: Sequence[Site], width: int,
         quote: str, lines: Sequence[str], jax_import_replaced: bool = False,
         walked: cst.CSTVisitor | None = None) -> Rewrites:
  """The rewrites of one file whose converted sites are ``sites``; ``width`` is its line
  limit, ``quote`` its strings' quote character, ``lines`` its text.
  ``jax_import_replaced``: ``from jax import device_put_replicated`` gives way to the
  support module's import (``--target jax``), so it does not hold the name.
  ``walked``: ``collector``'s visitor, when the caller has walked the module with it."""
  rewrites = Rewrites(quote=quote)
  text = "\n".join(lines)
  if "replicate" not in text:
    return rewrites
  if walked is None:
    walked = _Walk(get_metadata)
    module.visit(walked)
  assert isinstance(walked, _Walk)
  found = walked
  if not found.replicates:
    return rewrites
  feeds = _Feeds(get_metadata, found, sites)
  for call in found.replicates:
    axis = feeds.axis_of(call)
    if axis is None:
      continue
    pos = get_metadata(PositionProvider, call).start
    old = "flax.jax_utils.replicate" if call in found.flax else "jax.device_put_replicated"
    reason = _obstacle(get_metadata, call, jax_import_replaced)
    if reason is None:
      line = _too_long(get_metadata, call, _rewritten(call, axis, quote, _shift(call)), width,
                       lines)
      if line is not None:
        reason = f"the rewrite would make line {line} longer than the file's limit ({width})"
    if reason is not None:
      rewrites.findings.append(Finding(pos.line, pos.column + 1, Severity.INFO, (
          f"{old}'s values are passed to a converted site: its jax.jit compiles the first "
          f"step apart from the later ones unless they are laid out on the site's mesh "
          f"({SUPPORT_NAME}(..., axis_name={axis!r})); not rewritten: {reason}")))
      continue
    rewrites.axes[call] = axis
    rewrites.positions.add((pos.line, pos.column + 1))
    if call in found.flax:
      rewrites.flax.add(call)
    rewrites.findings.append(Finding(pos.line, pos.column + 1, Severity.INFO, _MESSAGE.format(
        old=old, name=SUPPORT_NAME, axis=axis)))
  if rewrites.flax:
    rewrites.flax_imports = found.flax_imports  # removed where nothing else uses them
  return rewrites


def _obstacle(get_metadata: Callable, call: cst.Call, jax_import_replaced: bool) -> str | None:
  scope = get_metadata(ScopeProvider, call, None)
  if scope is None:
    return "its scope is unknown"
  bindings = scope[SUPPORT_NAME] if SUPPORT_NAME in scope else ()
  if not all(support_module.is_import_of_support(b)
             or (jax_import_replaced and _is_jax_import(b)) for b in bindings):
    return f"the name {SUPPORT_NAME} is bound to something else here"
  if site_comments.comments_in(call):
    return "comments inside the call (each stays next to the argument it describes)"
  return None


def _is_jax_import(assignment) -> bool:
  """``from jax import device_put_replicated`` (not renamed)."""
  node = getattr(assignment, "node", None)
  return (isinstance(node, cst.ImportFrom) and node.module is not None and not node.relative
          and cst.Module([]).code_for_node(node.module) in ("jax", "jax.api")
          and not isinstance(node.names, cst.ImportStar)
          and any(a.evaluated_name == SUPPORT_NAME and a.asname is None for a in node.names))


class _Walk(FlaxImportsVisitor):
  """In one walk: the replicate calls, each call's positional arguments by the name they
  start from (``state`` of ``state`` or ``state.params``), single-name assignments from
  calls, and the Flax imports a rewrite may leave unused."""

  FUNCTION = "replicate"

  def __init__(self, get_metadata: Callable):
    super().__init__(get_metadata)
    self.replicates: list[cst.Call] = []
    self._candidates: list[cst.Call] = []  # calls of some ``replicate`` / device_put_replicated
    self.flax: set[cst.Call] = set()
    self.arguments: dict[cst.CSTNode, tuple[cst.Call, int]] = {}  # root -> (call, position)
    self.assigned: dict[cst.Call, cst.Name] = {}  # call -> the one name its result is bound to
    self.site_names: dict[cst.CSTNode, cst.Call] = {}  # name bound to a call -> that call
    self.returned: dict[cst.Call, cst.FunctionDef] = {}  # call -> the def returning it
    self.calls_of: dict[cst.Name, cst.Call] = {}  # a called name -> its call
    self._defs: list[cst.FunctionDef] = []

  def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
    self._defs.append(node)

  def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
    self._defs.pop()

  def visit_Return(self, node: cst.Return) -> None:
    if isinstance(node.value, cst.Call) and self._defs:
      self.returned[node.value] = self._defs[-1]

  def visit_Call(self, node: cst.Call) -> None:
    if isinstance(node.func, cst.Name):
      self.calls_of[node.func] = node
    for i, arg in enumerate(node.args):
      if arg.keyword is not None or arg.star:
        break
      root = arg.value
      while isinstance(root, cst.Attribute):
        root = root.value
      self.arguments[root] = (node, i)
    if last_name(node.func) not in _LAST or not 1 <= len(node.args) <= 2:
      return
    if not any(a.keyword is not None or a.star for a in node.args):
      self._candidates.append(node)  # whose it is, once every alias is known

  def leave_Module(self, original_node: cst.Module) -> None:
    for node in self._candidates:
      names = self.names(node.func)
      if names & _FLAX:
        self.flax.add(node)
        self.replicates.append(node)
      elif names & _JAX and len(node.args) == 2:
        self.replicates.append(node)

  def visit_Assign(self, node: cst.Assign) -> None:
    super().visit_Assign(node)
    if (len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name)
        and isinstance(node.value, cst.Call)):
      self.assigned[node.value] = node.targets[0].target
      self.site_names[node.targets[0].target] = node.value


class _Feeds:
  """Which converted sites a replicate call's result is passed to, and at which position."""

  def __init__(self, get_metadata: Callable, found: _Walk, sites: Sequence[Site]):
    self.get_metadata = get_metadata
    self.found = found
    self.by_node: dict[cst.CSTNode, Site] = {}  # site call, def, or a name bound to the call
    for site in sites:
      if site.fundef is not None:
        self.by_node[site.fundef] = site
      else:
        self.by_node[site.node] = site
    for name, call in found.site_names.items():
      if call in self.by_node:
        self.by_node[name] = self.by_node[call]

  def axis_of(self, call: cst.Call) -> str | None:
    """The one axis name of the converted sites ``call``'s result is passed to (directly,
    through a name, or as what a function such as ``def replicate(t): return
    jax.device_put_replicated(t, ...)`` returns), or None."""
    uses = self._uses(call)
    helper = self.found.returned.get(call)
    if helper is not None:
      for caller in self._calls_of(helper):
        uses += self._uses(caller)
    axes = set()
    for user, position in uses:
      site = self._site(user.func)
      if site is None:
        continue  # not a converted site: its arguments' layout does not matter here
      axis = _mapped_axis(site, position)
      if axis is None:
        return None
      axes.add(axis)
    return axes.pop() if len(axes) == 1 else None

  def _uses(self, call: cst.Call) -> list[tuple[cst.Call, int]]:
    uses = []
    if call in self.found.arguments:
      uses.append(self.found.arguments[call])
    name = self.found.assigned.get(call)
    if name is not None:
      uses += self._uses_of(name)
    return uses

  def _calls_of(self, fundef: cst.FunctionDef) -> list[cst.Call]:
    scope = self.get_metadata(ScopeProvider, fundef, None)
    if scope is None:
      return []
    calls = []
    for assignment in scope.assignments[fundef.name.value]:
      if getattr(assignment, "node", None) is fundef:
        calls += [self.found.calls_of[access.node] for access in assignment.references
                  if access.node in self.found.calls_of]
    return calls

  def _uses_of(self, name: cst.Name) -> list[tuple[cst.Call, int]]:
    scope = self.get_metadata(ScopeProvider, name, None)
    if scope is None:
      return []
    uses = []
    for access in scope.accesses[name.value]:
      if any(getattr(r, "node", None) is name for r in access.referents):
        if access.node in self.found.arguments:
          uses.append(self.found.arguments[access.node])
    return uses

  def _site(self, func: cst.BaseExpression) -> Site | None:
    if func in self.by_node:
      return self.by_node[func]
    if not isinstance(func, cst.Name):
      return None
    scope = self.get_metadata(ScopeProvider, func, None)
    if scope is None:
      return None
    referents = {r for access in scope.accesses[func] for r in access.referents}
    nodes = [getattr(r, "node", None) for r in referents]
    found = {self.by_node.get(node) if isinstance(node, cst.CSTNode) else None
             for node in nodes}
    return found.pop() if len(found) == 1 else None


def _mapped_axis(site: Site, position: int) -> str | None:
  """The axis name under which ``site`` maps the leading axis of its argument at
  ``position``; None when it does not, or when the site's mesh is not plain pmap's."""
  if len(site.levels()) != 1:
    return None
  options = site.options
  if any(options.get(name) is not None and not is_none(options.get(name))
         for name in _UNSUPPORTED_OPTIONS):
    return None
  try:
    static = int_tuple(options.get("static_broadcasted_argnums"), "static_broadcasted_argnums")
  except Exception:  # an unconvertible option: the site was reported already
    return None
  if static is None or position in static:
    return None
  in_axes = options.get("in_axes")
  if in_axes is not None:
    axis: cst.BaseExpression | None = in_axes
    if isinstance(in_axes, (cst.Tuple, cst.List)):
      if position >= len(in_axes.elements) or any(
          isinstance(el, cst.StarredElement) for el in in_axes.elements):
        return None
      axis = in_axes.elements[position].value
    if not (isinstance(axis, cst.Integer) and axis.value == "0"):
      return None
  name = options.get("axis_name")
  if not isinstance(name, cst.SimpleString):
    return None
  value = name.evaluated_value
  return value if isinstance(value, str) else None
