"""Pytree structure as plain JSON, independent of the JAX version that built the tree.

`describe(tree)` walks the output of a program and returns a JSON-able description
of its containers plus its leaves, each with a readable path. Containers are the
ones JAX flattens itself: dict and defaultdict (keys sorted, as JAX flattens them),
OrderedDict (insertion order), list, tuple, namedtuple and None. Any other pytree node registered
with JAX (a Flax struct, a FrozenDict, ...) is described generically by its class
name and its children's key paths. Everything else is a leaf.

`first_difference(a, b)` names where two descriptions disagree, as a path.
"""
from __future__ import annotations

import collections
from typing import Any

import jax

Leaves = list[tuple[str, Any]]


def _class_name(x: Any) -> str:
  cls = type(x)
  return f"{cls.__module__}.{cls.__qualname__}"


def _key_json(key: Any) -> Any:
  """A dict key as JSON: strings as themselves, anything else by type and repr."""
  return key if isinstance(key, str) else {"type": type(key).__name__, "repr": repr(key)}


def _dict_keys(d: dict) -> list:
  if isinstance(d, collections.OrderedDict):
    return list(d)
  try:
    return sorted(d)
  except TypeError:  # keys of mixed types: JAX keeps insertion order as well
    return list(d)


# The dict types JAX flattens itself; other dict subclasses are leaves unless registered.
_DICTS = (dict, collections.OrderedDict, collections.defaultdict)


def _is_namedtuple(x: Any) -> bool:
  return isinstance(x, tuple) and hasattr(type(x), "_fields")


def _registered_children(x: Any) -> list[tuple[str, Any]] | None:
  """One level of a JAX-registered pytree node: (key path, child) pairs; None for a leaf."""
  flat, _ = jax.tree_util.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)
  if len(flat) == 1 and flat[0][1] is x:
    return None
  return [(jax.tree_util.keystr(path), child) for path, child in flat]


def describe(tree: Any) -> tuple[dict, Leaves]:
  """Returns (structure description, [(path, leaf), ...]) in JAX's flattening order."""
  leaves: Leaves = []

  def walk(x: Any, path: str) -> dict:
    if x is None:
      return {"type": "none"}
    if type(x) in _DICTS:
      keys = _dict_keys(x)
      node = {"type": "dict", "keys": [_key_json(k) for k in keys],
              "children": [walk(x[k], f"{path}[{k!r}]") for k in keys]}
      if type(x) is not dict:
        node["class"] = _class_name(x)
      return node
    if _is_namedtuple(x):
      return {"type": "namedtuple", "class": _class_name(x), "fields": list(x._fields),
              "children": [walk(v, f"{path}.{f}") for f, v in zip(x._fields, x, strict=True)]}
    if type(x) in (list, tuple):
      return {"type": type(x).__name__,
              "children": [walk(v, f"{path}[{i}]") for i, v in enumerate(x)]}
    children = _registered_children(x)
    if children is not None:
      return {"type": "node", "class": _class_name(x), "keys": [k for k, _ in children],
              "children": [walk(child, path + key) for key, child in children]}
    leaves.append((path, x))
    return {"type": "leaf"}

  return walk(tree, ""), leaves


def display_path(path: str) -> str:
  return path or "<root>"


def _summary(node: dict) -> str:
  kind = node["type"]
  if kind == "dict":
    return f"a {node.get('class', 'dict')} with keys {node['keys']}"
  if kind == "namedtuple":
    return f"a namedtuple {node['class']} with fields {node['fields']}"
  if kind in ("list", "tuple"):
    return f"a {kind} of length {len(node['children'])}"
  if kind == "node":
    return f"a {node['class']} with children {node['keys']}"
  return {"none": "None", "leaf": "an array (leaf)"}[kind]


def _child_paths(node: dict) -> list[str]:
  kind = node["type"]
  if kind == "dict":
    return [f"[{k!r}]" if isinstance(k, str) else f"[{k['repr']}]" for k in node["keys"]]
  if kind == "namedtuple":
    return [f".{f}" for f in node["fields"]]
  if kind == "node":
    return list(node["keys"])
  return [f"[{i}]" for i in range(len(node.get("children", [])))]


def differences(recorded: dict, actual: dict, path: str = "") -> list[str]:
  """Every place where two descriptions disagree, outermost first, as readable lines."""
  same_shape = {k: v for k, v in recorded.items() if k != "children"} == {
      k: v for k, v in actual.items() if k != "children"} and len(
          recorded.get("children", [])) == len(actual.get("children", []))
  if not same_shape:
    return [f"tree structure differs at {display_path(path)}: recorded {_summary(recorded)}, "
            f"got {_summary(actual)}"]
  found = []
  for sub, r, a in zip(_child_paths(recorded), recorded.get("children", []),
                       actual.get("children", []), strict=True):
    found += differences(r, a, path + sub)
  return found
