"""``jax.pmap`` in a table of JAX transforms whose code inspects what they return.

``{type(t(lambda x: x)) for t in (jax.jit, jax.vmap, jax.pmap)}`` collects the types of
what JAX's transforms return, to recognise a transformed callable that callers' code
made (equinox does). Replacing pmap there with the support module's function changes what
the table holds for code that still has jax.pmap, so such a reference is left as it is
and reported. A table is a tuple, list or set literal listing pmap beside another of
JAX's transforms, iterated by a loop or comprehension (itself, or through a name bound
once to it); its code inspects them where the loop variable is anything but called and
its result called (``t(f)(x)`` runs the transform, which the support function does as
pmap did).
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import libcst as cst
from libcst.metadata import Assignment, QualifiedNameProvider, ScopeProvider

# JAX's function transforms, by the names code refers to them.
TRANSFORMS = frozenset({
    "jax.jit", "jax.vmap", "jax.grad", "jax.value_and_grad", "jax.jacfwd", "jax.jacrev",
    "jax.hessian", "jax.jvp", "jax.vjp", "jax.linearize", "jax.checkpoint", "jax.remat",
    "jax.custom_jvp", "jax.custom_vjp", "jax.named_call", "jax.shard_map",
    "jax.experimental.shard_map.shard_map", "jax.experimental.maps.xmap",
})

_Container = cst.Tuple | cst.List | cst.Set


class _Loops(cst.CSTVisitor):
  """Every loop and comprehension over a plain name (target, iterable, body), and the
  value of each plain ``name = <tuple, list or set>`` assignment."""

  def __init__(self) -> None:
    super().__init__()
    self.loops: list[tuple[cst.Name, cst.BaseExpression, Sequence[cst.CSTNode]]] = []
    self.values: dict[cst.Name, _Container] = {}

  def visit_For(self, node: cst.For) -> None:
    if isinstance(node.target, cst.Name):
      self.loops.append((node.target, node.iter, [node.body]))

  def _comprehension(self, node: cst.ListComp | cst.SetComp | cst.GeneratorExp | cst.DictComp,
                     body: Sequence[cst.CSTNode]) -> None:
    if isinstance(node.for_in.target, cst.Name):
      self.loops.append((node.for_in.target, node.for_in.iter, body))

  def visit_ListComp(self, node: cst.ListComp) -> None:
    self._comprehension(node, [node.elt])

  def visit_SetComp(self, node: cst.SetComp) -> None:
    self._comprehension(node, [node.elt])

  def visit_GeneratorExp(self, node: cst.GeneratorExp) -> None:
    self._comprehension(node, [node.elt])

  def visit_DictComp(self, node: cst.DictComp) -> None:
    self._comprehension(node, [node.key, node.value])

  def visit_Assign(self, node: cst.Assign) -> None:
    if (len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name)
        and isinstance(node.value, (cst.Tuple, cst.List, cst.Set))):
      self.values[node.targets[0].target] = node.value


class _Uses(cst.CSTVisitor):
  """Whether ``name`` is used, under ``root``, other than called with the result called."""

  def __init__(self, name: str) -> None:
    super().__init__()
    self._name = name
    self._run: set[cst.Name] = set()  # the callee of f(...)(...)
    self.inspected = False

  def visit_Call(self, node: cst.Call) -> None:
    inner = node.func
    if (isinstance(inner, cst.Call) and isinstance(inner.func, cst.Name)
        and inner.func.value == self._name):
      self._run.add(inner.func)

  def visit_Name(self, node: cst.Name) -> None:
    if node.value == self._name and node not in self._run:
      self.inspected = True


def inspected(module: cst.Module, get_metadata: Callable,
              refs: Collection[cst.CSTNode]) -> list[cst.CSTNode]:
  """The references among ``refs`` (pmap used as a value) in a table of JAX transforms
  whose loop inspects what it holds, in the order the loops appear."""
  if not refs:
    return []
  loops = _Loops()
  module.visit(loops)
  found: list[cst.CSTNode] = []
  for target, iterable, body in loops.loops:
    table = _table(iterable, loops.values, get_metadata)
    if table is None:
      continue
    ours = [e.value for e in table.elements if e.value in refs]
    if not ours or not any(_is_transform(e.value, get_metadata) for e in table.elements):
      continue
    uses = _Uses(target.value)
    for node in body:
      node.visit(uses)
    if uses.inspected:
      found += [r for r in ours if r not in found]
  return found


def _table(iterable: cst.BaseExpression, values: dict[cst.Name, _Container],
           get_metadata: Callable) -> _Container | None:
  """The tuple, list or set a loop runs over: itself, or the one a name is bound to once."""
  if isinstance(iterable, (cst.Tuple, cst.List, cst.Set)):
    return iterable
  if not isinstance(iterable, cst.Name):
    return None
  scope = get_metadata(ScopeProvider, iterable, None)
  bindings = list(scope[iterable.value]) if scope is not None else []
  if len(bindings) != 1 or not isinstance(bindings[0], Assignment):
    return None
  return values.get(bindings[0].node) if isinstance(bindings[0].node, cst.Name) else None


def _is_transform(value: cst.BaseExpression, get_metadata: Callable) -> bool:
  return any(q.name in TRANSFORMS for q in get_metadata(QualifiedNameProvider, value, set()))
