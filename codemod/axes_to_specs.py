"""pmap's ``in_axes`` / ``out_axes`` literals -> ``PartitionSpec`` source for shard_map.

An axes tree is read from the CST into plain Python (ints, ``None``, tuples, lists and
dicts keyed by literal source), then each leaf becomes a spec: ``k`` -> ``P(None, ...,
name)`` with ``k`` Nones, ``None`` -> ``P()``. Nested pmaps are combined level by level
into one spec per leaf over several mesh axes (positions in the original array).
Anything that is not a literal, or a negative axis (whose rank is unknown here, and
which legacy pmap rejects anyway), raises ``Unconvertible`` with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

import libcst as cst

Axes = Union[int, None, tuple, list, "KeyedAxes"]


class Unconvertible(Exception):
  """A site that cannot be rewritten exactly; the message says why."""


class NotLiteral(Unconvertible):
  """The axes are an expression (a name, a call): their specs are built at run time."""


@dataclass(frozen=True)
class KeyedAxes:
  """A dict literal of axes: ``items`` pairs a key's source text with its axes."""
  items: tuple[tuple[str, Any], ...]


def read_axes(node: cst.BaseExpression, what: str) -> Axes:
  """The axes tree a literal ``in_axes`` / ``out_axes`` expression denotes."""
  if isinstance(node, cst.Integer):
    return int(node.evaluated_value)
  if isinstance(node, cst.Name) and node.value == "None":
    return None
  if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
    if isinstance(node.expression, cst.Integer):
      raise Unconvertible(
          f"negative {what} {-int(node.expression.evaluated_value)}: the argument's rank is not "
          "known statically (legacy pmap also fails on it); write the non-negative axis")
  if isinstance(node, cst.Tuple):
    return tuple(_elements(node.elements, what))
  if isinstance(node, cst.List):
    return list(_elements(node.elements, what))
  if isinstance(node, cst.Dict):
    items = []
    for el in node.elements:
      if not isinstance(el, cst.DictElement) or not isinstance(
          el.key, (cst.SimpleString, cst.Integer)):
        raise NotLiteral(f"{what} dict needs literal keys to be converted")
      items.append((cst.Module([]).code_for_node(el.key), read_axes(el.value, what)))
    return KeyedAxes(tuple(items))
  code = cst.Module([]).code_for_node(node)
  raise NotLiteral(f"{what}={code} is not a literal, so its specs cannot be derived statically")


def _elements(elements, what: str) -> list:
  out = []
  for el in elements:
    if isinstance(el, cst.StarredElement):
      raise NotLiteral(f"{what} uses a starred element")
    out.append(read_axes(el.value, what))
  return out


def _is_leaf(axes: Axes) -> bool:
  return axes is None or isinstance(axes, int)


def _zip_levels(trees: list, what: str) -> Any:
  """Aligns the axes trees of nested levels: a leaf on one level spans a subtree on another."""
  nodes = [t for t in trees if not _is_leaf(t)]
  if not nodes:
    return ("leaf", tuple(trees))
  first = nodes[0]
  for other in nodes[1:]:
    if type(other) is not type(first) or _shape(other) != _shape(first):
      raise Unconvertible(f"the nested pmaps' {what} have different structures")
  children = []
  for i in range(len(_children(first))):
    children.append(_zip_levels([t if _is_leaf(t) else _children(t)[i] for t in trees], what))
  return ("node", first, tuple(children))


def _children(tree) -> list:
  return [v for _, v in tree.items] if isinstance(tree, KeyedAxes) else list(tree)


def _shape(tree):
  return tuple(k for k, _ in tree.items) if isinstance(tree, KeyedAxes) else len(tree)


def in_positions(axes_per_level: tuple, names: list[str]) -> dict[int, str]:
  """Where each level's mapped axis sits in the original argument (outer level first)."""
  taken: dict[int, str] = {}
  for axis, name in zip(axes_per_level, names, strict=True):
    if axis is None:
      continue
    free = [p for p in range(axis + len(taken) + 1) if p not in taken]
    taken[free[axis]] = name
  return taken


def out_positions(axes_per_level: tuple, names: list[str]) -> dict[int, str]:
  """Where each level put its axis in the final output: inner levels stack first."""
  placed: dict[int, str] = {}
  for axis, name in reversed(list(zip(axes_per_level, names, strict=True))):
    if axis is None:
      continue
    placed = {(p + 1 if p >= axis else p): n for p, n in placed.items()}
    placed[axis] = name
  return placed


def spec_source(positions: dict[int, str], p_name: str) -> str:
  if not positions:
    return f"{p_name}()"
  entries = [positions.get(i, "None") for i in range(max(positions) + 1)]
  return f"{p_name}({', '.join(entries)})"


def specs_source(trees: list, names: list[str], p_name: str, *, outputs: bool,
                 what: str) -> str:
  """Spec source for the axes trees of each nesting level (outer first)."""
  for tree in trees:
    _check_nonnegative(tree, what)
  zipped = _zip_levels(trees, what)
  top = _render(zipped, names, p_name, outputs)
  first = next((t for t in trees if not _is_leaf(t)), None)
  if not outputs and isinstance(first, list):
    # pmap treats a top-level in_axes list as the tuple of positional arguments.
    top = "(" + top[1:-1] + ("," if len(first) == 1 else "") + ")"
  return top


def _check_nonnegative(tree, what: str) -> None:
  if isinstance(tree, int) and tree < 0:
    raise Unconvertible(f"negative {what} {tree}: the rank is not known statically")
  if not _is_leaf(tree):
    for child in _children(tree):
      _check_nonnegative(child, what)


def _render(zipped, names, p_name, outputs) -> str:
  if zipped[0] == "leaf":
    place = out_positions if outputs else in_positions
    return spec_source(place(zipped[1], names), p_name)
  _, template, children = zipped
  parts = [_render(c, names, p_name, outputs) for c in children]
  if isinstance(template, KeyedAxes):
    return "{" + ", ".join(f"{k}: {v}" for (k, _), v in zip(template.items, parts, strict=True)) + "}"
  if isinstance(template, list):
    return "[" + ", ".join(parts) + "]"
  return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
