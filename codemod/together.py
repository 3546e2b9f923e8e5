"""Read-only visitors walked over a tree in one pass, without rebuilding it.

``node.visit(visitor)`` rebuilds every node it passes (``_visit_and_replace_children``
constructs and validates a copy even for a read-only visitor), which costs far more than
the visitors' own methods. ``walk`` calls the same ``on_visit`` / ``on_leave`` on the
same nodes in the same order, reading each node's children in the order libcst's walk
visits them, and serves several visitors at once: each sees exactly the calls its own
walk would make (a subtree its ``visit_*`` declines is skipped for it alone).
"""
from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Callable, Sequence

import libcst as cst

_ATTRIBUTE_HOOK = re.compile(r"(?:visit|leave)_[A-Z][A-Za-z]*_[a-z]")
# node class -> the fields holding its children, in the order libcst's walk visits them;
# None where that could not be read: its nodes' ``children`` are used (a rebuilding walk).
_ORDER: dict[type[cst.CSTNode], tuple[str, ...] | None] = {}


def _fields_of(node: cst.CSTNode, fields: tuple[str, ...]) -> list[cst.CSTNode]:
  found: list[cst.CSTNode] = []
  for name in fields:
    value = getattr(node, name)
    if isinstance(value, cst.CSTNode):
      found.append(value)
    elif isinstance(value, (tuple, list)):
      found.extend(item for item in value if isinstance(item, cst.CSTNode))
  return found


def _child_fields(node: cst.CSTNode) -> tuple[str, ...] | None:
  """The fields ``_visit_and_replace_children`` of ``node``'s class visits, in its order:
  the names its ``visit_*(self, "field", ...)`` calls pass, read from libcst's source once
  and checked against libcst's own ``children`` of this first node."""
  cls = type(node)
  order: tuple[str, ...] | None
  try:
    source = textwrap.dedent(inspect.getsource(cls._visit_and_replace_children))
    calls = sorted((n for n in ast.walk(ast.parse(source))
                    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                    and n.func.id.startswith("visit_") and len(n.args) >= 2
                    and isinstance(n.args[1], ast.Constant)),
                   key=lambda n: (n.lineno, n.col_offset))
    order = tuple(dict.fromkeys(str(c.args[1].value) for c in calls))  # type: ignore[attr-defined]
    if [id(c) for c in _fields_of(node, order)] != [id(c) for c in node.children]:
      order = None
  except (OSError, TypeError, SyntaxError, AttributeError):  # no source to read
    order = None
  _ORDER[cls] = order
  return order


_Hook = Callable[[cst.CSTVisitor, cst.CSTNode], object] | None
_Hooks = dict[type, tuple[_Hook, _Hook]]  # node class -> what on_visit / on_leave call
_TABLES: dict[type, _Hooks] = {}  # visitor class -> its hooks, filled as node classes come


def _own(cls: type, name: str) -> _Hook:
  """``cls``'s method ``name`` unless it is libcst's empty default (nothing to call)."""
  method = getattr(cls, name, None)
  return None if method is None or method is getattr(cst.CSTVisitor, name, None) else method


def _table(cls: type) -> _Hooks:
  table = _TABLES.get(cls)
  if table is None:
    names = [name for name in dir(cls) if _ATTRIBUTE_HOOK.match(name)
             and _own(cls, name) is not None]
    # walk calls no per-attribute hooks (visit_Call_func, ...): a visitor must not need them.
    assert not names, f"{cls.__name__} has per-attribute hooks: {names}"
    table = _TABLES[cls] = {}
  return table


def _hooks(table: _Hooks, cls: type, node_cls: type) -> tuple[_Hook, _Hook]:
  """What ``cls.on_visit`` / ``on_leave`` call for a ``node_cls`` node (None: nothing)."""
  enter = (cls.on_visit if _own(cls, "on_visit") is not None  # type: ignore[attr-defined]
           else _own(cls, f"visit_{node_cls.__name__}"))
  leave = (cls.on_leave if _own(cls, "on_leave") is not None  # type: ignore[attr-defined]
           else _own(cls, f"leave_{node_cls.__name__}"))
  hooks = table[node_cls] = (enter, leave)
  return hooks


def walk(root: cst.CSTNode, visitors: Sequence[cst.CSTVisitor]) -> None:
  """``root.visit(v)`` for each of ``visitors``, in one pass that rebuilds nothing."""
  Entry = tuple[cst.CSTVisitor, type, _Hooks]

  def visit(node: cst.CSTNode, active: list[Entry]) -> None:
    node_cls = type(node)
    inside = []
    for entry in active:
      v, cls, table = entry
      enter = (table.get(node_cls) or _hooks(table, cls, node_cls))[0]
      if enter is None or enter(v, node) is not False:  # libcst: only False skips children
        inside.append(entry)
    if inside:
      order = _ORDER[node_cls] if node_cls in _ORDER else _child_fields(node)
      if order is None:
        for child in node.children:
          visit(child, inside)
      else:
        for name in order:
          value = getattr(node, name)
          if isinstance(value, cst.CSTNode):
            visit(value, inside)
          elif isinstance(value, (tuple, list)):
            for item in value:
              if isinstance(item, cst.CSTNode):
                visit(item, inside)
    for v, _cls, table in active:
      leave = table[node_cls][1]
      if leave is not None:
        leave(v, node)

  visit(root, [(v, type(v), _table(type(v))) for v in visitors])
