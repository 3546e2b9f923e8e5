"""How many devices a function places its pmapped inputs on, where its code says so.

Legacy pmap ran each call on as many devices as its arguments had rows; a converted
site's mesh is built once, over ``jax.devices()`` unless something says otherwise. A
function that places the inputs itself, with ``jax.device_put_replicated(x,
jax.local_devices()[:n])`` (or ``jax.device_put_sharded``, or flax's ``replicate(x,
devices=...)``), says how many rows its sites get: brax's trainers do, and run on fewer
devices with ``max_devices_per_host``. The mesh that function's sites share then spans
that many, ``pmap_devices(rows=n)`` (every device in a multi-process job, where legacy
pmap required all of them).

``n`` must mean the same where the mesh is built, before the function's first site: every
name it reads is the function's own (or an import or a builtin) and is bound only before
both the mesh and the placement, and its calls only ask JAX for device counts. Where the
function places inputs on a list it does not spell so, or on different counts, nothing is
said and the mesh spans ``jax.devices()``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import libcst as cst
from libcst.metadata import (Assignment, BuiltinAssignment, ImportAssignment, PositionProvider,
                             QualifiedNameProvider, Scope, ScopeProvider)

# The calls that place a value on a list of devices: their devices argument's position.
_PLACERS = {"jax.device_put_replicated": 1, "jax.device_put_sharded": 1,
            "flax.jax_utils.replicate": 1}
# Device lists sliced by count; calls a count may make, with no effect and one answer.
_DEVICE_LISTS = frozenset({"jax.local_devices", "jax.devices"})
_COUNTS = frozenset({"jax.local_device_count", "jax.device_count", "jax.process_count",
                     "builtins.len", "builtins.min", "builtins.max", "builtins.int"})


class PlacedDevices:
  """Answers for one module, over the calls its analysis walk collected."""

  def __init__(self, get_metadata: Callable, calls: Iterable[cst.Call]) -> None:
    self._get = get_metadata
    self._calls = list(calls)

  def rows(self, scope: Scope | None, before: int) -> tuple[str, int] | None:
    """(the source of ``n``, the line of the first placement) where the code in
    ``scope`` (a function's, or the module's) places inputs on ``n`` devices, ``n`` being
    the same value at line ``before``, where the mesh of its sites is built; None where
    it places none, or on lists this cannot count the same way."""
    counts: set[str] = set()
    first = None
    for call in self._calls:
      if scope is None or self._get(ScopeProvider, call, None) is not scope:
        continue
      position = next((p for name, p in _PLACERS.items() if self._is(call.func, {name})),
                      None)
      if position is None:
        continue
      devices = _argument(call, position, "devices")
      line = self._get(PositionProvider, call).start.line
      if devices is None or _is_none(devices):
        return None  # every local device: the mesh over jax.devices() says so already
      n = self._count(devices)
      if n is None or not self._holds(n, scope, min(line, before)):
        return None
      counts.add(cst.Module([]).code_for_node(n))
      first = line if first is None else min(first, line)
    if len(counts) != 1 or first is None:
      return None
    return counts.pop(), first

  def _count(self, devices: cst.BaseExpression) -> cst.BaseExpression | None:
    """``n`` of ``jax.local_devices()[:n]`` or ``jax.devices()[:n]``."""
    if not (isinstance(devices, cst.Subscript) and len(devices.slice) == 1):
      return None
    listed, part = devices.value, devices.slice[0].slice
    if not (isinstance(listed, cst.Call) and not listed.args
            and self._is(listed.func, _DEVICE_LISTS)):
      return None
    if not (isinstance(part, cst.Slice) and part.lower is None and part.step is None
            and part.upper is not None):
      return None
    return part.upper

  def _holds(self, expr: cst.BaseExpression, scope: Scope, before: int) -> bool:
    """Whether ``expr`` has the same value anywhere after line ``before`` in ``scope``:
    names of the scope's own bound only above that line, imports and builtins, numbers,
    arithmetic, and calls of ``_COUNTS``."""
    if isinstance(expr, cst.Integer):
      return True
    if isinstance(expr, cst.Name):
      bindings = scope[expr.value]
      return (self._get(ScopeProvider, expr, None) is scope and bool(bindings)
              and all(isinstance(a, (BuiltinAssignment, ImportAssignment))
                      or (a.scope is scope and isinstance(a, Assignment)
                          and self._get(PositionProvider, a.node).start.line < before)
                      for a in bindings))
    if isinstance(expr, cst.BinaryOperation):
      return self._holds(expr.left, scope, before) and self._holds(expr.right, scope, before)
    if isinstance(expr, cst.UnaryOperation):
      return self._holds(expr.expression, scope, before)
    if isinstance(expr, cst.Call):
      return (self._is(expr.func, _COUNTS)
              and all(a.keyword is None and not a.star and self._holds(a.value, scope, before)
                      for a in expr.args))
    return False

  def _is(self, func: cst.BaseExpression, names: Iterable[str]) -> bool:
    wanted = set(names)
    return any(q.name in wanted for q in self._get(QualifiedNameProvider, func, set()))


def _argument(call: cst.Call, position: int, keyword: str) -> cst.BaseExpression | None:
  positional = [a for a in call.args if a.keyword is None and not a.star]
  if any(a.star for a in call.args) and len(positional) <= position:
    return None
  for arg in call.args:
    if arg.keyword is not None and arg.keyword.value == keyword:
      return arg.value
  return positional[position].value if len(positional) > position else None


def _is_none(node: cst.BaseExpression) -> bool:
  return isinstance(node, cst.Name) and node.value == "None"
