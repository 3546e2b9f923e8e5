"""Recognising pmap sites by meaning and reading their options.

A *reference* is any expression whose qualified name (libcst's QualifiedNameProvider)
is JAX's pmap, whatever it is spelled as. A *site* is a reference applied to a
function: ``pmap(f, ...)``, ``partial(pmap, ...)(f)``, or a decorator ``@pmap`` /
``@partial(pmap, ...)`` / on a def. ``PmapOptions`` holds the site's arguments as CST
nodes, merged the way ``functools.partial`` and pmap's signature merge them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import QualifiedNameProvider

from codemod import together
from codemod.axes_to_specs import Unconvertible
from codemod.bound_targets import BindingTargets
from codemod.related import RelatedPatterns

PMAP_NAMES = frozenset({"jax.pmap", "jax.api.pmap", "jax._src.api.pmap"})
PARTIAL_NAMES = frozenset({"functools.partial"})
# functools.wraps(pmap) / update_wrapper(f, pmap) copy pmap's name and docstring: pmap is
# not applied there, and jax.pmap keeps its metadata on every JAX.
_METADATA_FROM = {"wraps": ("functools.wraps", 0), "update_wrapper": ("functools.update_wrapper", 1)}
KNOWN_OPTIONS = ("fun", "axis_name", "in_axes", "out_axes", "static_broadcasted_argnums",
                 "devices", "backend", "axis_size", "donate_argnums", "global_arg_shapes")
_POSITIONAL = ("fun", "axis_name")


def pmap_imports_of(node: cst.ImportFrom) -> list[tuple[str, str | None]]:
  """(module, alias) for each ``from jax import pmap [as alias]`` name in ``node``."""
  module = cst.Module([]).code_for_node(node.module) if node.module else ""
  if module not in ("jax", "jax.api") or isinstance(node.names, cst.ImportStar):
    return []
  return [(module, a.evaluated_alias) for a in node.names if a.evaluated_name == "pmap"]


@dataclass
class PmapOptions:
  """A site's pmap arguments, by pmap's parameter name."""
  values: dict[str, cst.BaseExpression] = field(default_factory=dict)
  positional: int = 0  # how many positional arguments have been supplied so far
  # Some are passed with * or **: which ones, and their values, are known only at run
  # time (the readable ones are in ``values``, though * or ** may override them).
  starred: bool = False

  def get(self, name: str) -> cst.BaseExpression | None:
    return self.values.get(name)

  def merged(self, args: list[cst.Arg], skip_positional: int = 0) -> PmapOptions:
    """These options updated by a call's arguments (a partial's, then the call's)."""
    values = dict(self.values)
    position = self.positional + skip_positional
    starred = self.starred
    for arg in args:
      if arg.star:
        starred = True
        continue
      if arg.keyword is None:
        if starred:  # its position follows *args: unknown
          continue
        if position >= len(_POSITIONAL):
          raise Unconvertible("pmap is given more than two positional arguments")
        values[_POSITIONAL[position]] = arg.value
        position += 1
        continue
      name = arg.keyword.value
      if name not in KNOWN_OPTIONS:
        raise Unconvertible(f"pmap has no argument {name!r}")
      values[name] = arg.value
    return PmapOptions(values, position, starred)


def is_none(node: cst.BaseExpression | None) -> bool:
  return isinstance(node, cst.Name) and node.value == "None"


def int_tuple(node: cst.BaseExpression | None, what: str) -> tuple[int, ...] | None:
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


@dataclass(eq=False)
class Site:
  """One pmap application: a call, or a run of pmap decorators on one def."""
  node: cst.CSTNode                      # the Call, or the first pmap Decorator
  options: PmapOptions
  fun: cst.BaseExpression | None      # None for decorators (the def is the function)
  fundef: cst.FunctionDef | None = None
  decorators: tuple = ()                 # indices into fundef.decorators, outer first
  inner: Site | None = None         # a pmap applied directly inside this one
  absorbed: bool = False                 # this site is another site's `inner`
  error: str | None = None

  @property
  def outermost(self) -> bool:
    """Whether the def's pmap decorators are its first, so no other decorator wraps them."""
    return self.decorators[:1] == (0,)

  def levels(self) -> list[Site]:
    chain: list[Site] = []
    site: Site | None = self
    while site is not None:
      chain.append(site)
      site = site.inner
    return chain


def qualified(get_metadata, node: cst.CSTNode) -> set[str]:
  return {q.name for q in get_metadata(QualifiedNameProvider, node, set())}


class References(RelatedPatterns, BindingTargets):
  """Every expression that names JAX's pmap, and every Call/def for site analysis; in the
  same walk, the related patterns that only get report entries."""

  def __init__(self, get_metadata, target: str):
    super().__init__(get_metadata, target)
    self.refs: list[cst.CSTNode] = []
    self.calls: list[cst.Call] = []
    self.defs: list[cst.FunctionDef] = []
    self.pmap_imports: list[tuple[str, str | None]] = []
    # (module, alias) of each `import jax [as alias]` that a `jax.pmap` reference goes through
    self.pmap_module_imports: set[tuple[str, str | None]] = set()
    self.pmap_spellings: set[str] = {"pmap"}
    self.bound: set[cst.CSTNode] = set()  # assignment, del and loop targets
    self.metadata_only: set[cst.CSTNode] = set()  # what wraps / update_wrapper copy from

  def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
    for module, alias in pmap_imports_of(node):
      self.pmap_imports.append((module, alias))
      self.pmap_spellings.add(alias or "pmap")
    return super().visit_ImportFrom(node)

  # Qualified names are computed lazily, per node: ask only where the spelling could be pmap.
  def visit_Attribute(self, node: cst.Attribute) -> bool:
    if node.attr.value == "pmap":
      names = qualified(self.get_metadata, node) & PMAP_NAMES
      if names:
        self.refs.append(node)
        if isinstance(node.value, cst.Name):
          module = min(names).removesuffix(".pmap")
          alias = node.value.value
          self.pmap_module_imports.add((module, None if alias == module else alias))
        return False
    return super().visit_Attribute(node)

  def visit_Name(self, node: cst.Name) -> None:
    if node.value in self.pmap_spellings and qualified(self.get_metadata, node) & PMAP_NAMES:
      self.refs.append(node)
    else:
      super().visit_Name(node)

  def visit_Call(self, node: cst.Call) -> None:
    self.calls.append(node)
    func = node.func
    copied = _METADATA_FROM.get(func.attr.value if isinstance(func, cst.Attribute)
                                else func.value if isinstance(func, cst.Name) else "")
    if copied is not None and copied[0] in qualified(self.get_metadata, func):
      positional = [arg for arg in node.args if arg.keyword is None and not arg.star]
      given = [arg.value for arg in node.args
               if arg.keyword is not None and arg.keyword.value == "wrapped"]
      if len(positional) > copied[1]:
        given.append(positional[copied[1]].value)
      self.metadata_only.update(given)
    super().visit_Call(node)

  def bound_target(self, target: cst.BaseExpression) -> None:
    self.bound.add(target)  # a name of pmap bound or deleted there is never a value

  def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
    self.defs.append(node)


class _Contains(cst.CSTVisitor):
  """Which of some nodes occur inside a subtree."""

  def __init__(self, targets: set):
    self.targets = targets
    self.found: list = []

  def on_visit(self, node: cst.CSTNode) -> bool:
    if node in self.targets:
      self.found.append(node)
    return True


def contains(root: cst.CSTNode, targets: set) -> list:
  finder = _Contains(targets - {root})
  together.walk(root, [finder])
  return finder.found
