"""How many devices a function places its pmapped inputs on, where its code says so.

Legacy pmap ran each call on as many devices as its arguments had rows; a converted
site's mesh is built once, over ``jax.devices()`` unless something says otherwise. A
function that places the inputs itself, with ``jax.device_put_replicated(x,
jax.local_devices()[:n])`` (or ``jax.device_put_sharded``, or flax's ``replicate(x,
devices=...)``), itself or through a helper only this file binds that places them on as
many as one of its parameters says, says how many rows its sites get: brax's trainers do,
and run on fewer devices with ``max_devices_per_host``. The mesh that function's sites share then spans
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
from libcst.metadata import (Assignment, BuiltinAssignment, GlobalScope, ImportAssignment,
                             PositionProvider, QualifiedNameProvider, Scope, ScopeProvider)

# The calls that place a value on a list of devices: their devices argument's position.
_PLACERS = {"jax.device_put_replicated": 1, "jax.device_put_sharded": 1,
            "flax.jax_utils.replicate": 1}
# Device lists sliced by count; calls a count may make, with no effect and one answer.
_DEVICE_LISTS = frozenset({"jax.local_devices", "jax.devices"})


class _Nothing:
  """What a call that places nothing counts."""


_NOTHING = _Nothing()
_COUNTS = frozenset({"jax.local_device_count", "jax.device_count", "jax.process_count",
                     "builtins.len", "builtins.min", "builtins.max", "builtins.int"})


class PlacedDevices:
  """Answers for one module, over the calls its analysis walk collected."""

  def __init__(self, get_metadata: Callable, calls: Iterable[cst.Call]) -> None:
    self._get = get_metadata
    self._calls: dict[Scope | None, list[cst.Call]] = {}  # by the scope they run in
    for call in calls:
      self._calls.setdefault(get_metadata(ScopeProvider, call, None), []).append(call)

  def rows(self, scope: Scope | None, before: int) -> tuple[str, int] | None:
    """(the source of ``n``, the line of the first placement) where the code in
    ``scope`` (a function's, or the module's) places inputs on ``n`` devices, ``n`` being
    the same value at line ``before``, where the mesh of its sites is built; None where
    it places none, or on lists this cannot count the same way."""
    if scope is None:
      return None
    counts: set[str] = set()
    first = None
    for call in self._calls.get(scope, ()):
      n = self._placed_count(call)
      if isinstance(n, _Nothing):
        continue
      line = self._get(PositionProvider, call).start.line
      if n is None or not self._holds(n, scope, min(line, before)):
        return None
      counts.add(cst.Module([]).code_for_node(n))
      first = line if first is None else min(first, line)
    if len(counts) != 1 or first is None:
      return None
    return counts.pop(), first

  def _placed_count(self, call: cst.Call, through_helpers: bool = True
                    ) -> cst.BaseExpression | _Nothing | None:
    """``n`` where ``call`` places a value on ``n`` devices, itself or through a helper
    of this file that places it on as many as one of its parameters says (brax's
    ``_init_training_state(..., local_devices_to_use=n)``): the argument given for that
    parameter. ``_NOTHING`` where it places nothing, None where this cannot count."""
    called = {q.name for q in self._get(QualifiedNameProvider, call.func, set())}
    position = next((p for name, p in _PLACERS.items() if name in called), None)
    if position is not None:
      devices = _argument(call, position, "devices")
      # None: every local device, which the mesh over jax.devices() says already
      return None if devices is None or _is_none(devices) else self._count(devices)
    helper = self._helper(call.func) if through_helpers else None
    if helper is None:
      return _NOTHING
    inner = self._get(ScopeProvider, helper.body, None)
    counts = [self._placed_count(c, through_helpers=False)
              for c in self._calls.get(inner, ())]
    named = {n.value if isinstance(n, cst.Name) else None
             for n in counts if not isinstance(n, _Nothing)}
    if not named:
      return _NOTHING
    name = named.pop() if len(named) == 1 else None
    params = [p.name.value for p in helper.params.params]
    keywords = [p.name.value for p in helper.params.kwonly_params]
    if (name is None or name not in params + keywords or inner is None
        or not all(isinstance(a, Assignment) and isinstance(a.node, cst.Param)
                   for a in inner.assignments[name])):
      return None
    return _argument(call, params.index(name) if name in params else None, name)

  def _helper(self, func: cst.BaseExpression) -> cst.FunctionDef | None:
    """The undecorated def ``func`` names, where only this file can bind it (a nested
    def, or a module's private ``_name``) and nothing binds it again."""
    scope = self._get(ScopeProvider, func, None)
    if not isinstance(func, cst.Name) or scope is None:
      return None
    bound = list(scope[func.value])
    if len(bound) != 1 or not isinstance(bound[0], Assignment):
      return None
    node = bound[0].node
    if not isinstance(node, cst.FunctionDef) or node.decorators or (
        isinstance(bound[0].scope, GlobalScope) and not func.value.startswith("_")):
      return None
    return node

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


def _argument(call: cst.Call, position: int | None, keyword: str
              ) -> cst.BaseExpression | None:
  """The argument ``call`` passes for a parameter (None where it cannot be told)."""
  for arg in call.args:
    if arg.keyword is not None and arg.keyword.value == keyword:
      return arg.value
  if any(a.star for a in call.args) or position is None:
    return None
  positional = [a for a in call.args if a.keyword is None]
  return positional[position].value if len(positional) > position else None


def _is_none(node: cst.BaseExpression) -> bool:
  return isinstance(node, cst.Name) and node.value == "None"
