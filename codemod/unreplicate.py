"""Rewrites ``x[0]`` of converted pmap outputs into the support module's ``first_row(s)``.

On the ``NamedSharding`` arrays a converted site returns, ``x[0]`` is a gather across
the devices (compiled once per leaf shape, and failing when some devices belong to other
processes), where legacy pmap's ``x[0]`` handed back device 0's buffer. In a file with
at least one converted site this transform rewrites

  ``flax.jax_utils.unreplicate(t)`` (any import form)  ->  ``first_rows(t)``
  ``jax.tree.map(lambda x: x[0], t)`` (or ``jax.tree_util.tree_map``, ``jax.tree_map``,
      ``tree_multimap``)                                ->  ``first_rows(t)``
  the same with more arguments (``is_leaf=``)         ->  the lambda alone: ``first_row``
  ``out[0]``, ``step(x)[0]``, ``out.a.b[0]``             ->  ``first_row(out)``

each only where the value read (``t``, every tree the map is given, ``out``) is at that
point a converted site's output or a replicated value: a call of the site (``step``
bound only to one) or of ``flax.jax_utils.replicate`` / ``jax.device_put_replicated``,
a name whose every binding that may reach that point (``codemod.reaching``: rebinding,
branches, loops) is to such a call's results (``out = step(x)``, ``state, out =
step(x)``), an attribute of one, a tuple, list or dict literal of them, or a parameter,
never rebound, of a function only this file can call (nested, or private to the module)
and only calls, where every call passes it such a value (an ``_unreplicate(tree)`` helper).

``first_row(x)`` is ``x[0]`` exactly, for every ``x``: a jax Array with a local shard
holding row 0 whole gives that row read from the shard's buffer (same values, dtype,
shape and weak type, on that device, committed to it where legacy pmap's ``x[0]`` was
not), and anything else (numpy arrays, Python values such as a tuple of outputs, tracers, PRNG key
arrays) is indexed as ``x[0]``; ``first_rows(t)`` is ``jax.tree.map(first_row, t)``, its
rows read in one program per device. So the rewrite is safe on any value; but it, and
its entry, say the value is a converted site's output, so it is rewritten only where
that is proven at that point: elsewhere an INFO entry says why it stays (for a name bound
to such outputs at some other point, ``model = init(); model[0]; model = replicate(model)``,
that another binding may reach it, or that its value cannot be followed there).
What else stays reported (the INFO ``related`` gives, with the reason) is what the
transform cannot rewrite cleanly: the support name bound to something else where the
rewrite would use it, comments inside the replaced text, or a line that would grow past
the file's limit.
Files without converted sites are only reported: their ``x[0]`` may well not be pmap's.
"""
from __future__ import annotations

import collections
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

import libcst as cst
from libcst.metadata import FunctionScope, PositionProvider, ScopeProvider

from codemod import function_exits, reaching, related, site_calls, site_comments, support_module
from codemod.bound_targets import BindingTargets
from codemod.flax_imports import FlaxImportsVisitor, last_name
from codemod.findings import Finding, Severity

SUPPORT_NAME = "first_row"    # x[0] of one value
TREE_SUPPORT_NAME = "first_rows"  # x[0] of every leaf
_FLAX_UNREPLICATE = frozenset({"flax.jax_utils.unreplicate"})
# What stacks one copy per device (the codemod may lay these out on a site's mesh, where
# x[0] is a gather too): Flax's replicate and JAX's device_put_replicated.
_REPLICATE = frozenset({"flax.jax_utils.replicate", "jax.device_put_replicated",
                        "jax.api.device_put_replicated"})
_REPLICATE_LAST = frozenset(name.rsplit(".", 1)[1] for name in _REPLICATE)
# Attributes holding an array's metadata, not one of its rows: ``out.shape[0]`` stays.
_METADATA = frozenset({"shape", "dtype", "ndim", "size", "itemsize", "nbytes", "sharding",
                       "addressable_shards", "global_shards", "devices", "aval",
                       "weak_type", "format", "layout"})
_TREE_MAPS = frozenset({"jax.tree.map", "jax.tree_util.tree_map", "jax.tree_map",
                        "jax.tree_multimap", "jax.tree_util.tree_multimap"})
_TREE_MAP_LAST = frozenset(name.rsplit(".", 1)[1] for name in _TREE_MAPS)
_MAYBE = re.compile(r"\[\s*0\s*\]|unreplicate")  # text any candidate holds
_REPORTED = related.GUIDANCE["unreplicate"][1]  # the message these rewrites replace

_SUPPORT = {"flax": TREE_SUPPORT_NAME, "tree_map": TREE_SUPPORT_NAME, "lambda": SUPPORT_NAME,
            "subscript": SUPPORT_NAME}
_MESSAGES = {
    "flax": "flax.jax_utils.unreplicate rewritten to {name}",
    "tree_map": "a tree map of lambda x: x[0] rewritten to {name}(...)",
    "lambda": "lambda x: x[0] rewritten to {name}",
    "subscript": "[0] of a converted pmap site's output rewritten to {name}(...)",
}
_WHY = (", which reads row 0 from the device holding it (x[0] on the converted output is a "
        "gather across devices, compiled per shape); same values, dtype and shape")


@dataclass
class Rewrites:
  """What the transform changes in one file, keyed by original nodes."""
  kinds: dict[cst.CSTNode, str] = field(default_factory=dict)  # node -> a key of _SUPPORT
  findings: list[Finding] = field(default_factory=list)
  positions: set[tuple[int, int]] = field(default_factory=set)  # (line, column) of candidates
  flax_imports: list[tuple[str, str | None, str | None]] = field(default_factory=list)

  @property
  def nodes(self) -> list[cst.CSTNode]:
    return list(self.kinds)

  def support_names(self) -> list[str]:
    """The support functions the new code calls."""
    return sorted({_SUPPORT[kind] for kind in self.kinds.values()})

  def code(self) -> list[str]:
    """Text of the new code (for the imports it needs)."""
    return [f"{name}(" for name in self.support_names()]

  def kept(self, findings: Sequence[Finding]) -> list[Finding]:
    """``findings`` without related's unreplicate entries for the candidates here (each
    has an entry of its own: rewritten, or why not)."""
    return [f for f in findings
            if not (f.message == _REPORTED and (f.line, f.column) in self.positions)]

  def apply(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:
    """The new node for ``original`` (``updated`` holds its rewritten children)."""
    kind = self.kinds.get(original)
    if kind is None:
      return updated
    return _rewritten(kind, updated)


def _rewritten(kind: str, node: cst.CSTNode) -> cst.CSTNode:
  name = cst.Name(_SUPPORT[kind])
  if kind == "flax":
    assert isinstance(node, cst.Call)
    return node.with_changes(func=name)
  if kind == "tree_map":  # f(lambda x: x[0], tree) -> first_rows(tree), tree as written
    assert isinstance(node, cst.Call)
    tree = node.args[1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return node.with_changes(func=name, args=(tree,))
  if kind == "lambda":
    assert isinstance(node, cst.Lambda)
    return name.with_changes(lpar=node.lpar, rpar=node.rpar)
  assert isinstance(node, cst.Subscript)
  return cst.Call(name, (cst.Arg(node.value),), lpar=node.lpar, rpar=node.rpar)


def collector(get_metadata: Callable, text: str) -> cst.CSTVisitor | None:
  """The visitor ``plan`` needs to have walked the module (None: ``text`` holds nothing
  it looks for), for a caller that walks it with others."""
  return _Idioms(get_metadata) if _MAYBE.search(text) else None


def plan(module: cst.Module, get_metadata: Callable, site_nodes: Sequence[cst.CSTNode],
         site_defs: Sequence[cst.FunctionDef], width: int, lines: Sequence[str],
         walked: cst.CSTVisitor | None = None) -> Rewrites:
  """The rewrites of one file whose converted sites are ``site_nodes`` (calls) and
  ``site_defs`` (decorated defs); ``width`` is its line limit, ``lines`` its text;
  ``walked``: ``collector``'s visitor, when the caller has walked the module with it."""
  if not _MAYBE.search("\n".join(lines)):
    return Rewrites()  # no [0] and no unreplicate: nothing to walk for
  if walked is None:
    walked = _Idioms(get_metadata)
    module.visit(walked)
  assert isinstance(walked, _Idioms)
  found = walked
  outputs = _Outputs(module, get_metadata, found, set(site_nodes), set(site_defs))
  verdicts = {node: outputs.verdict(node.value) for node in found.subscripts
              if node not in found.stored}
  candidates: list[tuple[cst.CSTNode, str]] = (
      [(node, "flax") for node in found.flax_calls]
      + [(node, "tree_map") for node in found.tree_maps]
      + [(node, "lambda") for node in found.lambdas]
      + [(node, "subscript") for node, (output, _) in verdicts.items() if output])
  candidates.sort(key=lambda item: _start(get_metadata, item[0]))
  rewrites = Rewrites()
  unproven: dict[cst.CSTNode, str] = {}  # tree forms whose trees are not shown outputs
  for node, kind in candidates:
    if kind != "subscript":
      why = outputs.trees_verdict(_trees(node, kind, found))
      if why is not None:
        unproven[node] = why
  growth: collections.Counter = collections.Counter()  # line -> characters added so far

  def obstacle(node: cst.CSTNode, kind: str) -> str | None:
    reason = _obstacle(get_metadata, node, kind)
    if reason is not None:
      return reason
    added = _growth(get_metadata, node, kind)
    over = [line for line, n in added.items()
            if n > 0 and len(lines[line - 1]) + growth[line] + n > width]
    if over:
      return f"the rewrite would make line {over[0]} longer than the file's limit ({width})"
    growth.update(added)
    return None

  for node, kind in candidates:
    reason = unproven.get(node) or obstacle(node, kind)
    if reason is not None and kind == "tree_map" and node not in unproven:
      rewrites.positions.add(_column(get_metadata, node))
      node, kind = cast(cst.Call, node).args[0].value, "lambda"  # the lambda alone, if it can be
      reason = obstacle(node, kind)
    line, column = _column(get_metadata, node)
    rewrites.positions.add((line, column))  # related's entry is replaced by this one
    if kind == "tree_map":
      rewrites.positions.add(_column(get_metadata, cast(cst.Call, node).args[0].value))
    if reason is not None:
      rewrites.findings.append(Finding(line, column, Severity.INFO,
                                       f"{_REPORTED} (not rewritten: {reason})"))
      continue
    rewrites.kinds[node] = kind
    rewrites.findings.append(Finding(line, column, Severity.INFO,
                                     (_MESSAGES[kind] + _WHY).format(name=_SUPPORT[kind])))
  for node, (_, why) in verdicts.items():
    if why is not None:
      line, column = _column(get_metadata, node)
      rewrites.findings.append(Finding(line, column, Severity.INFO,
                                       f"{_code(node.value)}[0] left as written: {why}"))
  rewrites.findings.sort(key=lambda f: (f.line, f.column))
  if any(kind == "flax" for kind in rewrites.kinds.values()):
    rewrites.flax_imports = found.flax_imports  # removed where nothing else uses them
  return rewrites


def _trees(node: cst.CSTNode, kind: str, found: _Idioms) -> list[cst.BaseExpression] | None:
  """The values a tree form reads row 0 of (None: not all of them can be told)."""
  if kind in ("flax", "tree_map"):
    return [cast(cst.Call, node).args[-1].value]
  call = found.lambda_calls[cast(cst.Lambda, node)]
  if any(a.star for a in call.args):
    return None
  return [a.value for a in call.args if a.value is not node and (
      a.keyword is None or a.keyword.value == "tree")]


def _column(get_metadata: Callable, node: cst.CSTNode) -> tuple[int, int]:
  """Where a finding about ``node`` goes: its line and 1-based column."""
  pos = get_metadata(PositionProvider, node).start
  return pos.line, pos.column + 1


def _start(get_metadata: Callable, node: cst.CSTNode) -> tuple[int, int]:
  pos = get_metadata(PositionProvider, node).start
  return pos.line, pos.column


def _code(node: cst.CSTNode) -> str:
  return cst.Module([]).code_for_node(node)


def _growth(get_metadata: Callable, node: cst.CSTNode, kind: str) -> collections.Counter:
  """Characters the rewrite adds to each line it touches. It adds no line breaks; where it
  removes some (a tree map's lambda on a line of its own), the lines that are left hold
  the tree argument as it was, and only the first line can grow."""
  old = _code(node.with_changes(lpar=(), rpar=()))
  new = _code(_rewritten(kind, node).with_changes(lpar=(), rpar=()))
  first = get_metadata(PositionProvider, node).start.line
  if getattr(node, "lpar", ()):
    first = get_metadata(PositionProvider, node.lpar[-1]).end.line  # type: ignore[attr-defined]
  old_lines, new_lines = old.split("\n"), new.split("\n")
  if len(old_lines) != len(new_lines):
    return collections.Counter({first: len(new_lines[0]) - len(old_lines[0])})
  return collections.Counter({first + i: len(b) - len(a)
                              for i, (a, b) in enumerate(zip(old_lines, new_lines, strict=True))})


def _obstacle(get_metadata: Callable, node: cst.CSTNode, kind: str) -> str | None:
  """Why ``node`` cannot be rewritten cleanly, or None."""
  scope = get_metadata(ScopeProvider, node, None)
  if scope is None:
    return "its scope is unknown"
  name = _SUPPORT[kind]
  if support_module.taken(get_metadata, node, [name]):
    return f"the name {name} is bound to something else here"
  removed: list[cst.CSTNode] = [node]
  if kind == "flax":
    removed = [node.func]  # type: ignore[attr-defined]
  elif kind == "tree_map":
    removed = [node.func, node.args[0]]  # type: ignore[attr-defined]
  elif kind == "subscript":
    removed = list(node.slice)  # type: ignore[attr-defined]
  if any(site_comments.comments_in(part) for part in removed):
    return "comments inside the text it replaces"
  return None


def _is_index0(node: cst.Subscript) -> bool:
  if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
    return False
  index = node.slice[0].slice
  return (index.star is None and isinstance(index.value, cst.Integer)
          and index.value.value == "0")


class _Idioms(FlaxImportsVisitor, BindingTargets):
  """The candidates in one walk: flax unreplicate calls, ``lambda x: x[0]`` given to a
  tree map, ``NAME[0]`` / ``CALL[0]`` subscripts, the subscripts that are assigned or
  deleted, the assignments from calls, and the flax.jax_utils imports."""

  FUNCTION = "unreplicate"

  def __init__(self, get_metadata: Callable):
    super().__init__(get_metadata)
    self.flax_calls: list[cst.Call] = []
    self._unreplicates: list[cst.Call] = []  # calls of some ``unreplicate``
    self.lambdas: list[cst.Lambda] = []
    self.tree_maps: list[cst.Call] = []  # f(lambda x: x[0], tree), nothing else
    self.lambda_calls: dict[cst.Lambda, cst.Call] = {}  # the tree map each lambda is given to
    self.calls: dict[cst.CSTNode, cst.Call] = {}  # calls of a name, by the name
    self.subscripts: list[cst.Subscript] = []
    self.stored: set[cst.Subscript] = set()
    self._indexed: set[cst.Subscript] = set()  # subscripts that are indexed again
    self.assigns: list[cst.Assign] = []

  def visit_Call(self, node: cst.Call) -> None:
    func = node.func
    if isinstance(func, cst.Name):
      self.calls[func] = node
    last = last_name(func)
    if last == "unreplicate":
      if len(node.args) == 1 and node.args[0].keyword is None and not node.args[0].star:
        self._unreplicates.append(node)  # whose it is, once every alias is known
    elif last in _TREE_MAP_LAST:
      first = node.args[0] if node.args else None
      fun = (first.value if first is not None and first.keyword is None and not first.star
             else next((a.value for a in node.args
                        if a.keyword is not None and a.keyword.value == "f"), None))
      # The qualified name (costly) only for the idiom's shape.
      if (isinstance(fun, cst.Lambda) and _is_first_row_lambda(fun)
          and self.names(func) & _TREE_MAPS):
        if len(node.args) == 2 and all(a.keyword is None and not a.star for a in node.args):
          self.tree_maps.append(node)
        else:
          self.lambdas.append(fun)
          self.lambda_calls[fun] = node

  def visit_Subscript(self, node: cst.Subscript) -> None:
    value = node.value
    if isinstance(value, cst.Subscript):
      self._indexed.add(value)  # visited before it: parents come first
    # An attribute's [0] indexed again (``state.stats[0][0]``) most likely picks a tuple
    # field's element, not a row: left as written.
    if (_is_index0(node) and isinstance(_root(value), (cst.Name, cst.Call))
        and not (isinstance(value, cst.Attribute)
                 and (value.attr.value in _METADATA or node in self._indexed))):
      self.subscripts.append(node)

  def leave_Module(self, original_node: cst.Module) -> None:
    self.flax_calls = [c for c in self._unreplicates if self.names(c.func) & _FLAX_UNREPLICATE]

  def visit_Assign(self, node: cst.Assign) -> None:
    super().visit_Assign(node)
    self.assigns.append(node)

  def bound_target(self, target: cst.BaseExpression) -> None:
    if isinstance(target, cst.Subscript):
      self.stored.add(target)


def _is_first_row_lambda(node: cst.Lambda) -> bool:
  params = node.params
  if (len(params.params) != 1 or params.posonly_params or params.kwonly_params
      or not isinstance(params.star_arg, cst.MaybeSentinel) or params.star_kwarg is not None
      or params.params[0].default is not None):
    return False
  body = node.body
  return (isinstance(body, cst.Subscript) and isinstance(body.value, cst.Name)
          and body.value.value == params.params[0].name.value and _is_index0(body)
          and not body.lpar)


def _root(value: cst.BaseExpression) -> cst.BaseExpression:
  """``out`` of ``out.a.b``: an attribute of a pmap output is one of its outputs too."""
  while isinstance(value, cst.Attribute):
    value = value.value
  return value


class _Outputs:
  """Which expressions are a converted site's outputs (or replicated values): a call of
  the site (or of a name bound only to it) or of Flax's ``replicate``, a name whose every
  binding that may reach the expression is to such calls' results, or an attribute of
  either."""

  def __init__(self, module: cst.Module, get_metadata: Callable, found: _Idioms,
               site_nodes: set, site_defs: set):
    self.module = module
    self.get_metadata = get_metadata
    self.found = found
    self.site_nodes = site_nodes
    self.site_bindings: set[cst.CSTNode] = set(site_defs)  # defs, and names bound to sites
    for assign in found.assigns:
      if assign.value in site_nodes:
        self.site_bindings.update(t.target for t in assign.targets
                                  if isinstance(t.target, cst.Name))
    self._following: set = set()  # the functions (and parameters) being followed
    self._producers: dict[cst.FunctionDef, bool] = {}  # helpers known to return outputs
    self.output_bindings: set[cst.CSTNode] = set()
    for assign in found.assigns:
      if isinstance(assign.value, cst.Call) and self._is_producer(assign.value.func):
        self.output_bindings.update(n for target in assign.targets
                                    for n in _names_in(target.target))

  def _referents(self, name: cst.Name) -> set | None:
    scope = self.get_metadata(ScopeProvider, name, None)
    if scope is None:
      return None
    referents = set()
    for access in scope.accesses[name]:
      referents.update(access.referents)
    return referents or None

  def _is_site(self, func: cst.BaseExpression) -> bool:
    if func in self.site_nodes:
      return True
    if not isinstance(func, cst.Name):
      return False
    referents = self._referents(func)
    return referents is not None and all(getattr(r, "node", None) in self.site_bindings
                                         for r in referents)

  def _is_producer(self, func: cst.BaseExpression) -> bool:
    """A converted site, or Flax's ``replicate`` / JAX's ``device_put_replicated`` (whose
    values converted code also holds as one row per device), or a function of this file
    that only returns what those return."""
    if self._is_site(func):
      return True
    if last_name(func) in _REPLICATE_LAST and bool(self.found.names(func) & _REPLICATE):
      return True
    referents = self._referents(func) if isinstance(func, cst.Name) else None
    if not referents or len(referents) != 1:
      return False
    fun = getattr(next(iter(referents)), "node", None)
    if (not isinstance(fun, cst.FunctionDef) or fun.decorators or fun.asynchronous
        or fun in self._following):
      return False
    if fun in self._producers:  # each call of a helper asks again
      return self._producers[fun]
    exits = function_exits.exits(fun)
    last = fun.body.body[-1] if isinstance(fun.body, cst.IndentedBlock) else fun.body
    ends = (isinstance(last, cst.SimpleStatementLine) and bool(last.body)
            and isinstance(last.body[-1], cst.Return))
    if not ends or exits.yields:
      answer = False  # it may fall off its end (None), or it is a generator
    else:
      self._following.add(fun)
      try:
        answer = all(isinstance(r.value, cst.Call) and self._is_producer(r.value.func)
                     for r in exits.returns)
      finally:
        self._following.discard(fun)
    self._producers[fun] = answer  # a cycle of helpers is False whichever is asked first
    return answer

  def trees_verdict(self, trees: list[cst.BaseExpression] | None) -> str | None:
    """None where every tree a tree form reads is an output here, else why it stays."""
    if trees is None:
      return "its trees are passed with * or **"
    for tree in trees:
      output, why = self.verdict(tree)
      if not output:
        return why or (f"`{_code(tree)}` is not shown to be a converted site's output or a "
                       "replicated value here")
    return None

  def verdict(self, value: cst.BaseExpression) -> tuple[bool, str | None]:
    """Whether ``value`` is an output here, and if not, why, where that is worth an entry:
    a name bound to outputs somewhere, whose value here may be another."""
    value = _root(value)
    if isinstance(value, cst.Call):
      return self._is_producer(value.func), None
    if isinstance(value, (cst.Tuple, cst.List, cst.Dict)):  # the tree forms' containers
      return bool(value.elements) and all(
          isinstance(e, (cst.Element, cst.DictElement)) and self.verdict(e.value)[0]
          for e in value.elements), None
    if not isinstance(value, cst.Name):
      return False, None
    referents = self._referents(value)
    if referents is None:
      return False, None
    if not any(getattr(r, "node", None) in self.output_bindings for r in referents):
      return self._parameter_of_outputs(value), None
    name = value.value
    reach = reaching.reaching(self.module, self.get_metadata, value)
    if reach is None:
      return False, (f"which value `{name}` holds here cannot be followed (a global, "
                     "nonlocal or enclosing scope's name, or one bound in a nested scope)")
    others = sorted(self._line(n) for n in reach.bindings - self.output_bindings)
    if others:
      return False, (f"`{name}` may hold a value other than a converted site's output or a "
                     f"replicated value here (bound at line {others[0]})")
    if reach.outside:
      return False, f"`{name}` may hold here what it held before this body bound it"
    if not reach.bindings:
      return False, f"no binding of `{name}` reaches this point"
    return True, None

  def _parameter_of_outputs(self, name: cst.Name) -> bool:
    """Whether ``name`` reads a parameter, never rebound, of a function only this file can
    call (a nested one, or a module's private one) and only calls, where every call passes
    it an output."""
    scope = self.get_metadata(ScopeProvider, name, None)
    if not isinstance(scope, FunctionScope) or not any(
        isinstance(getattr(a, "node", None), cst.Param) for a in scope[name.value]):
      return False  # the flow analysis below is the costly part
    reach = reaching.reaching(self.module, self.get_metadata, name)
    if reach is None or reach.outside or len(reach.bindings) != 1:
      return False
    param = next(iter(reach.bindings))
    if not isinstance(param, cst.Param):
      return False
    fun = scope.node
    if not isinstance(fun, cst.FunctionDef):
      return False
    positional = [*fun.params.posonly_params, *fun.params.params]
    keyword_ok = param not in fun.params.posonly_params
    if param not in positional and param not in fun.params.kwonly_params:
      return False  # *args or **kwargs
    outer = self.get_metadata(ScopeProvider, fun, None)
    if fun.decorators or outer is None or (fun, param) in self._following:
      return False
    if len(outer.assignments[fun.name.value]) != 1:
      return False  # the name may call another function too
    calls = site_calls.calls_of(self.get_metadata, fun.name.value, fun, fun, self.found.calls)
    if calls is None:
      return False  # other modules may call it, or it is handed on as a value
    self._following.add((fun, param))
    try:
      for call in calls:
        if any(a.star for a in call.args):
          return False  # arguments unpacked
        given = [a.value for a in call.args
                 if keyword_ok and a.keyword is not None and a.keyword.value == param.name.value]
        if not given and param in positional:
          index = positional.index(param)
          plain = [a.value for a in call.args if a.keyword is None]
          given = plain[index:index + 1]
        if not given or not self.verdict(given[0])[0]:
          return False
      return True
    finally:
      self._following.discard((fun, param))

  def _line(self, node: cst.CSTNode) -> int:
    return self.get_metadata(PositionProvider, node).start.line


def _names_in(target: cst.BaseExpression) -> list[cst.Name]:
  """The names a target binds to whole outputs: ``out``, or the names in ``a, (b, c)``
  (a starred name binds a list of them: not an output)."""
  if isinstance(target, cst.Name):
    return [target]
  if isinstance(target, (cst.Tuple, cst.List)):
    return [name for element in target.elements if not isinstance(element, cst.StarredElement)
            for name in _names_in(element.value)]
  return []
