"""Recognising pmap sites by meaning and reading their options.

A *reference* is any expression whose qualified name (libcst's QualifiedNameProvider)
is JAX's pmap, whatever it is spelled as. A *site* is a reference applied to a
function: ``pmap(f, ...)``, ``partial(pmap, ...)(f)``, or a decorator ``@pmap`` /
``@partial(pmap, ...)`` / on a def. ``PmapOptions`` holds the site's arguments as CST
nodes, merged the way ``functools.partial`` and pmap's signature merge them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import libcst as cst

from codemod.specs import Unconvertible

PMAP_NAMES = frozenset({"jax.pmap", "jax.api.pmap", "jax._src.api.pmap"})
PARTIAL_NAMES = frozenset({"functools.partial"})
KNOWN_OPTIONS = ("fun", "axis_name", "in_axes", "out_axes", "static_broadcasted_argnums",
                 "devices", "backend", "axis_size", "donate_argnums", "global_arg_shapes")
_POSITIONAL = ("fun", "axis_name")


@dataclass
class PmapOptions:
  """A site's pmap arguments, by pmap's parameter name."""
  values: dict[str, cst.BaseExpression] = field(default_factory=dict)
  positional: int = 0  # how many positional arguments have been supplied so far

  def get(self, name: str) -> Optional[cst.BaseExpression]:
    return self.values.get(name)

  def merged(self, args: list[cst.Arg], skip_positional: int = 0) -> "PmapOptions":
    """These options updated by a call's arguments (a partial's, then the call's)."""
    values = dict(self.values)
    position = self.positional + skip_positional
    for arg in args:
      if arg.star:
        raise Unconvertible("pmap's arguments are passed with * or **, so they cannot be read")
      if arg.keyword is None:
        if position >= len(_POSITIONAL):
          raise Unconvertible("pmap is given more than two positional arguments")
        values[_POSITIONAL[position]] = arg.value
        position += 1
        continue
      name = arg.keyword.value
      if name not in KNOWN_OPTIONS:
        raise Unconvertible(f"pmap has no argument {name!r}")
      values[name] = arg.value
    return PmapOptions(values, position)


def is_none(node: Optional[cst.BaseExpression]) -> bool:
  return isinstance(node, cst.Name) and node.value == "None"


def int_tuple(node: Optional[cst.BaseExpression], what: str) -> Optional[tuple[int, ...]]:
  """A literal int / tuple of ints, checked non-negative; None when not a literal."""
  if node is None:
    return ()
  items = node.elements if isinstance(node, (cst.Tuple, cst.List)) else None
  values = [node] if items is None else [el.value for el in items]
  out = []
  for v in values:
    if isinstance(v, cst.UnaryOperation) and isinstance(v.operator, cst.Minus):
      raise Unconvertible(f"negative {what}: write the non-negative position")
    if not isinstance(v, cst.Integer):
      return None
    out.append(int(v.evaluated_value))
  return tuple(out)
