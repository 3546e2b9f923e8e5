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

A function that places nothing may still make its sites' inputs with ``n`` rows: where
every call of each of its sites passes, at a position pmap maps over axis 0, a value
``jax.random.split(key, n)`` made (brax's ARS and ES trainers, ``max_devices_per_host``
again), or an array made with ``n`` rows (``jnp.ones((n, 3))``, ``np.zeros([n])``, that
times a number: a test's inputs), that ``n`` is said the same way (``rows_fed``). A
count that means every local device (``jax.local_device_count()``) says nothing the
mesh does not say already.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import (Assignment, BuiltinAssignment, GlobalScope, ImportAssignment,
                             PositionProvider, QualifiedNameProvider, Scope, ScopeProvider)

from codemod import reaching
from codemod.bound_targets import AssignedValues

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
# Calls whose result has as many rows as an argument says: its (position, keyword).
_ROW_MAKERS = {"jax.random.split": (1, "num")}
# Calls whose result has the shape their first argument (``shape``) says, rows first.
_SHAPE_MAKERS = frozenset(f"{module}.{name}" for module in ("jax.numpy", "numpy")
                          for name in ("ones", "zeros", "empty", "full"))
# Arithmetic with a Python number keeps an array's shape.
_ELEMENTWISE = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.FloorDivide,
                cst.Modulo, cst.Power)
_EVERY_DEVICE = frozenset({"jax.local_device_count", "jax.device_count"})

# The calls of one site, with the positions pmap maps over axis 0 (None: every one).
Feed = tuple[Sequence[cst.Call], frozenset[int] | None]


@dataclass(frozen=True)
class Rows:
  """A mesh's row count: ``count``'s source, the line saying it and how (for the report)."""
  count: str
  line: int
  how: str


def axis_zero_positions(in_axes: cst.BaseExpression | None) -> frozenset[int] | None:
  """The argument positions pmap's ``in_axes`` maps over axis 0: None for every one (no
  in_axes, or 0), those of a tuple's 0 entries, else none known."""
  if in_axes is None or (isinstance(in_axes, cst.Integer) and in_axes.value == "0"):
    return None
  if isinstance(in_axes, (cst.Tuple, cst.List)):
    return frozenset(i for i, e in enumerate(in_axes.elements)
                     if isinstance(e.value, cst.Integer) and e.value.value == "0")
  return frozenset()


class PlacedDevices:
  """Answers for one module, over the calls its analysis walk collected."""

  def __init__(self, module: cst.Module, get_metadata: Callable,
               calls: Iterable[cst.Call]) -> None:
    self._module = module
    self._get = get_metadata
    self._calls: dict[Scope | None, list[cst.Call]] = {}  # by the scope they run in
    for call in calls:
      self._calls.setdefault(get_metadata(ScopeProvider, call, None), []).append(call)
    self._values: dict[cst.CSTNode, dict[cst.CSTNode, cst.BaseExpression]] = {}

  def rows(self, scope: Scope | None, before: int) -> Rows | None:
    """The rows ``n`` where the code in ``scope`` (a function's, or the module's) places
    inputs on ``n`` devices, ``n`` being the same value at line ``before``, where the
    mesh of its sites is built; None where it places none, or on lists this cannot
    count the same way."""
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
    return Rows(counts.pop(), first, "the function places its inputs on")

  def rows_fed(self, feeds: Sequence[Feed], scope: Scope | None, before: int) -> Rows | None:
    """The rows ``n`` where every call in ``feeds`` (those of the sites sharing a mesh in
    ``scope``) passes, at a position mapped over axis 0, a value made with ``n`` rows
    (``_made_rows``), ``n`` being the same value at line ``before``, where that mesh is
    built; None where one does not, or ``n`` means every local device."""
    if scope is None or not feeds:
      return None
    counts: set[str] = set()
    first: tuple[int, str] | None = None  # the first maker's line and name
    for calls, positions in feeds:
      for call in calls:
        made = None
        for i, arg in enumerate(call.args):
          if arg.star or arg.keyword is not None:
            break
          if positions is None or i in positions:
            made = self._made_rows(arg.value)
            if made is not None:
              break
        if made is None or not self._holds(made[0], scope, before) or self._every(made[0]):
          return None
        counts.add(cst.Module([]).code_for_node(made[0]))
        first = made[1:] if first is None else min(first, made[1:])
    if len(counts) != 1 or first is None:
      return None
    return Rows(counts.pop(), first[0], f"the rows {first[1]} makes for its calls")

  def _made_rows(self, value: cst.BaseExpression
                 ) -> tuple[cst.BaseExpression, int, str] | None:
    """(``n``, the line and the name of the call making it) where ``value`` has ``n``
    rows: ``jax.random.split(key, n)``, an array made in shape ``(n, ...)``, either
    in arithmetic with a number, or a name every binding reaching it binds to one, all
    with the same ``n``."""
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, _ELEMENTWISE):
      if _is_number(value.right):
        return self._made_rows(value.left)
      return self._made_rows(value.right) if _is_number(value.left) else None
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator,
                                                          (cst.Minus, cst.Plus)):
      return self._made_rows(value.expression)
    if isinstance(value, cst.Call):
      n = self._made_by_call(value)
      return None if n is None else (n, self._get(PositionProvider, value).start.line,
                                     cst.Module([]).code_for_node(value.func))
    if not isinstance(value, cst.Name):
      return None
    reach = reaching.reaching(self._module, self._get, value)
    scope = self._get(ScopeProvider, value, None)
    if reach is None or reach.outside or not reach.bindings or scope is None:
      return None
    values = self._assigned(scope.node)
    found = [self._made_rows(values[b]) if b in values else None for b in reach.bindings]
    if None in found or len({cst.Module([]).code_for_node(f[0]) for f in found if f}) != 1:
      return None
    return min((f for f in found if f), key=lambda f: f[1])

  def _made_by_call(self, call: cst.Call) -> cst.BaseExpression | None:
    """``n`` where ``call`` makes ``n`` rows: ``jax.random.split(key, n)``, or an array
    constructor given the shape ``n`` or ``(n, ...)``."""
    for name, (position, keyword) in _ROW_MAKERS.items():
      if self._is(call.func, (name,)):
        n = _argument(call, position, keyword)
        if n is None and len(call.args) == 1 and not call.args[0].star:
          n = cst.Integer("2")  # split's default
        return n
    if not self._is(call.func, _SHAPE_MAKERS):
      return None
    shape = _argument(call, 0, "shape")
    if isinstance(shape, (cst.Tuple, cst.List)):
      first = shape.elements[0] if shape.elements else None
      return None if first is None or isinstance(first, cst.StarredElement) else first.value
    return shape if isinstance(shape, cst.Integer) else None

  def _every(self, n: cst.BaseExpression) -> bool:
    """Whether ``n`` is ``jax.local_device_count()`` (or ``jax.device_count()``), or a
    name bound once, to it: the mesh over ``jax.devices()`` says that already."""
    if isinstance(n, cst.Name):
      scope = self._get(ScopeProvider, n, None)
      bound = list(scope[n.value]) if scope is not None else []
      if len(bound) != 1 or not isinstance(bound[0], Assignment):
        return False
      owner = getattr(bound[0].scope, "node", None)  # a function's or the module's
      value = None if owner is None else self._assigned(owner).get(bound[0].node)
      return value is not None and self._every(value)
    return (isinstance(n, cst.Call) and not n.args and self._is(n.func, _EVERY_DEVICE))

  def _assigned(self, owner: cst.CSTNode) -> dict[cst.CSTNode, cst.BaseExpression]:
    """The values the plain assignments of ``owner``'s body bind, read once per body."""
    if owner not in self._values:
      self._values[owner] = {}
      owner.visit(AssignedValues(self._values[owner]))
    return self._values[owner]

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
    """Whether ``expr`` has the same value anywhere after line ``before`` in ``scope``
    (and the functions nested in it): names of the scope's own bound only above that
    line, imports and builtins, numbers, arithmetic, and calls of ``_COUNTS``."""
    if isinstance(expr, cst.Integer):
      return True
    if isinstance(expr, cst.Name):
      # Read in ``scope`` or in a function nested in it, bound in ``scope``.
      own = self._get(ScopeProvider, expr, None)
      bindings = own[expr.value] if own is not None else ()
      return (bool(bindings)
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


def _is_number(node: cst.BaseExpression) -> bool:
  """A Python number, as written: ``2``, ``0.5``, ``-1``."""
  if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)):
    return _is_number(node.expression)
  return isinstance(node, (cst.Integer, cst.Float))


def _is_none(node: cst.BaseExpression) -> bool:
  return isinstance(node, cst.Name) and node.value == "None"
