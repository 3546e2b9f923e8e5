"""The loops inside a pmap call, seen one iteration at a time.

A program whose loop runs inside one pmap call (numpyro's chain, brax's training epoch)
compounds rounding within that call, so comparing the call's outputs cannot separate an
XLA upgrade's last-bit differences from a real change. `stepping(fun, axis_names, visitor)`
returns `fun` rewritten so that, at the end of every iteration of every `scan` and
`while` loop in it (nested ones too, and those inside jitted or custom-derivative
functions), what the loop receives and what the iteration returns go to the host:
`visitor.step(loop, part, device, path, values)` sees them per device (the parts:
ENTRY, INPUT, RESULT below) and returns the values the program goes on with. A recorder
stores them and hands them back; a replayer stores this run's and hands back the
recorded ones, so every iteration computes from the recorded values and only one
iteration's rounding is ever compared.

The rewrite works on the jaxpr of the mapped function (after its own autodiff and
vmaps), evaluated again equation by equation: every equation is bound as it was, except
that loops are rebuilt around their body with `lax.scan` / `lax.while_loop` plus a
counter and a `jax.pure_callback` per part, and jitted functions, custom-derivative functions,
remat and conds holding loops are inlined into the call (XLA inlines them anyway).
Loops are numbered depth first as the program holds them; `path` is the iteration index
of each enclosing loop, then this loop's. `device` is the index along the site's mapped
axes (`lax.axis_index`). Loops inside other mapped or sharded computations nested in the
site are left as they are.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from typing import Any, Protocol
from collections.abc import Callable, Sequence

import jax
import jax.extend.core as jex
import numpy as np
from jax import lax

LOOPS = ("scan", "while")
# Call-like equations whose body is inlined when it holds a loop: name -> the parameter
# holding the body (jit was pjit before jax 0.7; custom_vjp_call_jaxpr is the older
# custom_vjp_call). Their results equal their body's: nothing differentiates the call
# again, and XLA inlines calls.
CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr",
         "core_call": "call_jaxpr", "custom_jvp_call": "call_jaxpr",
         "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
         "checkpoint": "jaxpr", "remat": "jaxpr", "remat2": "jaxpr"}


Types = tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype) of each value

# What the host sees of a loop, and may replace: `ENTRY` once per run of the loop (the
# initial values of the carried values its iterations change: computed before it),
# `INPUT` each scan iteration's slice of the scanned-over operands, `RESULT` each
# iteration's result (the carried values it changes, then a scan's per-iteration
# outputs). With all three replaced by the recorded ones, an iteration computes from the
# recorded values. The loop's constants (and carried values no iteration changes, which
# newer JAX turns into constants) are not seen: how a release splits them is its own.
ENTRY, INPUT, RESULT = "entry", "input", "result"
PARTS = (ENTRY, INPUT, RESULT)


@dataclasses.dataclass(frozen=True)
class Loop:
  """One loop of a site's program."""
  number: int  # depth first, in the order the program holds its loops
  kind: str  # "scan" or "while"
  enclosing: tuple[int, ...]  # the numbers of the loops around it, outermost first
  # The positions in the carry of the values an iteration changes (one it passes through
  # unchanged is a constant of the loop, seen on entry only).
  positions: tuple[int, ...]
  types: dict[str, Types]  # part -> the types of its values
  where: str  # the program's line that made it (the innermost frame outside JAX)

  @property
  def depth(self) -> int:
    return len(self.enclosing)

  def describe(self) -> str:
    return f"loop {self.number} ({self.kind} at {self.where})"

  def same_as(self, other: Loop) -> bool:
    """The same loop, as far as a recording of it goes (where its changed values sit in
    the carry is the release's own)."""
    return (self.kind, self.enclosing, self.types) == (other.kind, other.enclosing,
                                                       other.types)

  def as_json(self) -> dict:
    return {"number": self.number, "kind": self.kind, "enclosing": list(self.enclosing),
            "positions": list(self.positions),
            "types": {part: [[list(shape), dtype] for shape, dtype in types]
                      for part, types in self.types.items()},
            "where": self.where}

  @classmethod
  def from_json(cls, d: dict) -> Loop:
    return cls(d["number"], d["kind"], tuple(d["enclosing"]), tuple(d["positions"]),
               {part: tuple((tuple(shape), dtype) for shape, dtype in types)
                for part, types in d["types"].items()}, d["where"])


class Visitor(Protocol):
  def traced(self, loops: list[Loop]) -> None:
    """Called when the site is traced, with every loop its program holds (maybe none)."""

  def step(self, loop: Loop, part: str, device: int, path: tuple[int, ...],
           values: list[np.ndarray]) -> Sequence[np.ndarray]:
    """Called on the host with one part of a loop (see PARTS); returns the values the
    program goes on with. `path` is the iteration of each enclosing loop, then (except
    for ENTRY) this loop's."""


def stepping(fun: Callable[..., Any], axis_names: Any, visitor: Visitor) -> Callable[..., Any]:
  """`fun`, for the body of a map over `axis_names`, with what each of its loops receives
  and each iteration returns handed to `visitor` (see the module docstring). Arguments
  that are not traced (static ones) reach `fun` as they are."""

  @functools.wraps(fun)
  def stepped(*args: Any, **kwargs: Any) -> Any:
    flat, tree = jax.tree_util.tree_flatten((args, kwargs))
    traced = [i for i, x in enumerate(flat) if isinstance(x, jax.core.Tracer)]
    out_trees = []

    def on_traced(*values: Any) -> list[Any]:
      leaves = list(flat)
      for i, value in zip(traced, values, strict=True):
        leaves[i] = value
      call_args, call_kwargs = jax.tree_util.tree_unflatten(tree, leaves)
      # The leaves, not the tree: make_jaxpr would rebuild the tree around shape
      # placeholders, which a pytree class that checks its fields (brax's UInt64) rejects.
      out, out_tree = jax.tree_util.tree_flatten(fun(*call_args, **call_kwargs))
      out_trees.append(out_tree)
      return out

    inputs = [flat[i] for i in traced]
    closed = jax.make_jaxpr(on_traced)(*inputs)
    numbering = _Numbering()
    block = _layout(closed.jaxpr, numbering)
    visitor.traced(numbering.loops)
    if not block.holds_loops:
      outs = jex.jaxpr_as_fun(closed)(*inputs)
    else:
      device = lax.axis_index(axis_names)
      outs = _Evaluator(visitor, device).run(closed.jaxpr, closed.consts, inputs, block, ())
    return jax.tree_util.tree_unflatten(out_trees[-1], outs)

  return stepped


# --------------------------------------------------------------------------- layout


class _Numbering:
  def __init__(self) -> None:
    self.loops: list[Loop] = []


@dataclasses.dataclass
class _Block:
  """One jaxpr where the site's program holds it: its loops and the blocks inside them."""
  loops: dict[int, Loop] = dataclasses.field(default_factory=dict)  # equation index -> loop
  inner: dict[int, list[_Block]] = dataclasses.field(default_factory=dict)
  holds_loops: bool = False


def _sub_jaxprs(eqn: Any) -> list[Any]:
  """The closed jaxprs the evaluator enters for this equation, in its parameter order."""
  name, params = eqn.primitive.name, eqn.params
  if name == "scan":
    return [params["jaxpr"]]
  if name == "while":
    return [params["cond_jaxpr"], params["body_jaxpr"]]
  if name == "cond":
    return list(params["branches"])
  if name in CALLS and CALLS[name] in params:
    body = params[CALLS[name]]
    return [body if hasattr(body, "consts") else jex.ClosedJaxpr(body, ())]
  return []


def _layout(jaxpr: Any, numbering: _Numbering, enclosing: tuple[int, ...] = ()) -> _Block:
  block = _Block()
  for index, eqn in enumerate(jaxpr.eqns):
    name = eqn.primitive.name
    if name in LOOPS:
      positions, types = _part_types(eqn)
      loop = Loop(len(numbering.loops), name, enclosing, positions, types, _program_line(eqn))
      block.loops[index] = loop
      numbering.loops.append(loop)
      block.holds_loops = True
      block.inner[index] = [_layout(sub.jaxpr, numbering, (*enclosing, loop.number))
                            for sub in _sub_jaxprs(eqn)]
    else:
      inner = [_layout(sub.jaxpr, numbering, enclosing) for sub in _sub_jaxprs(eqn)]
      if any(b.holds_loops for b in inner):
        block.inner[index] = inner
        block.holds_loops = True
  return block


def _part_types(eqn: Any) -> tuple[tuple[int, ...], dict[str, Types]]:
  """The positions of the carried values the loop's body changes (a body that returns its
  input variable passes that value through), and the types of each part's values."""
  params = eqn.params
  if eqn.primitive.name == "scan":
    start, count, body = params["num_consts"], params["num_carry"], params["jaxpr"].jaxpr
    scanned = [v.aval for v in body.invars[start + count:]]
    outputs = body.outvars[count:]
  else:
    start, body = params["body_nconsts"], params["body_jaxpr"].jaxpr
    count = len(eqn.invars) - params["cond_nconsts"] - start
    scanned, outputs = [], []
  inputs, results = body.invars[start:start + count], body.outvars[:count]
  positions = tuple(i for i, (v_in, v_out) in enumerate(zip(inputs, results, strict=True))
                    if v_in is not v_out)
  types = lambda avals: tuple((tuple(a.shape), str(a.dtype)) for a in avals)  # noqa: E731
  return positions, {
      ENTRY: types(inputs[i].aval for i in positions), INPUT: types(scanned),
      RESULT: types([inputs[i].aval for i in positions] + [v.aval for v in outputs])}


_JAX_DIR = os.path.dirname(jax.__file__)
_OWN_DIR = os.path.dirname(__file__)


def _program_line(eqn: Any) -> str:
  """file:line of the innermost frame that made `eqn` outside JAX and this package."""
  traceback = getattr(getattr(eqn, "source_info", None), "traceback", None)
  for frame in getattr(traceback, "frames", None) or ():
    file = frame.file_name
    if not file.startswith((_JAX_DIR, _OWN_DIR)) and "jaxlib" not in file:
      return f"{os.path.basename(file)}:{frame.line_num}"
  return "?"


# --------------------------------------------------------------------------- evaluation


def _bind(eqn: Any, values: list[Any]) -> list[Any]:
  """The equation applied to `values`, as jax's own jaxpr evaluation applies it."""
  bind_params = eqn.primitive.get_bind_params(eqn.params)
  # (subfuns, params) through jax 0.8; the params alone, subfuns among them, after.
  subfuns, params = bind_params if isinstance(bind_params, tuple) else ((), bind_params)
  context = getattr(getattr(eqn, "ctx", None), "manager", contextlib.nullcontext())
  with context:
    outs = eqn.primitive.bind(*subfuns, *values, **params)
  return list(outs) if eqn.primitive.multiple_results else [outs]


def _is_key(x: Any) -> bool:
  return jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


class _Evaluator:
  """Evaluates a jaxpr again, rebuilding its loops with a host step per iteration."""

  def __init__(self, visitor: Visitor, device: Any):
    self.visitor = visitor
    self.device = device

  def run(self, jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], block: _Block,
          path: tuple[Any, ...]) -> list[Any]:
    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
      return v.val if isinstance(v, jex.Literal) else env[v]

    for var, value in zip(jaxpr.constvars, consts, strict=True):
      env[var] = value
    for var, value in zip(jaxpr.invars, args, strict=True):
      env[var] = value
    for index, eqn in enumerate(jaxpr.eqns):
      values = [read(v) for v in eqn.invars]
      if index in block.loops:
        outs = self._loop(eqn, values, block.loops[index], block.inner[index], path)
      elif index in block.inner:
        outs = self._enter(eqn, values, block.inner[index], path)
      else:
        outs = _bind(eqn, values)
      for var, value in zip(eqn.outvars, outs, strict=True):
        env[var] = value
    return [read(v) for v in jaxpr.outvars]

  def _enter(self, eqn: Any, values: list[Any], inner: list[_Block],
             path: tuple[Any, ...]) -> list[Any]:
    subs = _sub_jaxprs(eqn)
    if eqn.primitive.name == "cond":
      index, operands = values[0], values[1:]
      branches = [functools.partial(self._closed, sub, block, path)
                  for sub, block in zip(subs, inner, strict=True)]
      return list(lax.switch(index, branches, *operands))
    (sub,), (block,) = subs, inner
    return self._closed(sub, block, path, *values)

  def _closed(self, closed: Any, block: _Block, path: tuple[Any, ...], *args: Any) -> list[Any]:
    return self.run(closed.jaxpr, closed.consts, args, block, path)

  def _loop(self, eqn: Any, values: list[Any], loop: Loop, inner: list[_Block],
            path: tuple[Any, ...]) -> list[Any]:
    params = eqn.params
    positions = loop.positions

    def with_results(carry: list[Any], results: list[Any]) -> list[Any]:
      carry = list(carry)
      for i, value in zip(positions, results, strict=True):
        carry[i] = value
      return carry

    if loop.kind == "scan":
      (body_block,) = inner
      body = params["jaxpr"]
      n_consts, n_carry = params["num_consts"], params["num_carry"]
      consts, xs = values[:n_consts], values[n_consts + n_carry:]
      init = values[n_consts:n_consts + n_carry]
      init = with_results(init, self._visit(loop, ENTRY, path, [init[i] for i in positions]))

      def scan_step(state: tuple[Any, list[Any]], x: list[Any]) -> tuple[Any, list[Any]]:
        count, carry = state
        here = (*path, count)
        x = self._visit(loop, INPUT, here, list(x))
        outs = self._closed(body, body_block, here, *consts, *carry, *x)
        results = self._visit(loop, RESULT, here,
                              [outs[i] for i in positions] + list(outs[n_carry:]))
        return ((count + 1, with_results(outs[:n_carry], results[:len(positions)])),
                results[len(positions):])

      (_, carry), ys = lax.scan(scan_step, (np.int32(0), list(init)), list(xs),
                                length=params["length"], reverse=params["reverse"],
                                unroll=params["unroll"])
      return [*carry, *ys]
    cond_block, body_block = inner
    cond, body = params["cond_jaxpr"], params["body_jaxpr"]
    n_cond, n_body = params["cond_nconsts"], params["body_nconsts"]
    cond_consts, body_consts = values[:n_cond], values[n_cond:n_cond + n_body]
    init = values[n_cond + n_body:]
    init = with_results(init, self._visit(loop, ENTRY, path, [init[i] for i in positions]))

    def go_on(state: tuple[Any, list[Any]]) -> Any:
      count, carry = state
      return self._closed(cond, cond_block, (*path, count), *cond_consts, *carry)[0]

    def while_step(state: tuple[Any, list[Any]]) -> tuple[Any, list[Any]]:
      count, carry = state
      here = (*path, count)
      outs = self._closed(body, body_block, here, *body_consts, *carry)
      return count + 1, with_results(outs, self._visit(loop, RESULT, here,
                                                       [outs[i] for i in positions]))

    _, carry = lax.while_loop(go_on, while_step, (np.int32(0), list(init)))
    return list(carry)

  def _visit(self, loop: Loop, part: str, path: tuple[Any, ...], values: list[Any]) -> list[Any]:
    """`values` after the visitor saw them: what the host hands back."""
    if not values:
      return values
    values = [x if isinstance(x, (jax.Array, jax.core.Tracer)) else jax.numpy.asarray(x)
              for x in values]  # a literal operand
    keys = [jax.random.key_impl(x) if _is_key(x) else None for x in values]
    raw = [jax.random.key_data(x) if key is not None else x
           for x, key in zip(values, keys, strict=True)]
    shapes = [jax.ShapeDtypeStruct(np.shape(x), x.dtype) for x in raw]
    depth = len(path)
    pieces = [_pieces(x) for x in raw]

    def on_host(device: np.ndarray, *rest: np.ndarray) -> list[np.ndarray]:
      indices = tuple(int(i) for i in rest[:depth])
      flat = iter(rest[depth:])
      seen = [np.concatenate([np.asarray(next(flat)) for _ in parts]).reshape(s.shape)
              for parts, s in zip(pieces, shapes, strict=True)]
      back = self.visitor.step(loop, part, int(device), indices, seen)
      return [np.asarray(b, dtype=s.dtype).reshape(s.shape)
              for b, s in zip(back, shapes, strict=True)]

    back = jax.pure_callback(on_host, shapes, self.device, *path,
                             *(piece for parts in pieces for piece in parts))
    back = [_varying_like(b, x) for b, x in zip(back, raw, strict=True)]
    return [jax.random.wrap_key_data(b, impl=key) if key is not None else b
            for b, key in zip(back, keys, strict=True)]


# A callback's operands are put on the first CPU device before the Python function sees
# them, and on the CPU backend a transfer larger than 100 KiB waits for a thread of the
# pool that runs the devices' programs: inside a pmap whose loop also holds a collective,
# every such thread can be waiting at the collective for a device stuck in its callback,
# and the program deadlocks (jax 0.6.0 and 0.10.2 alike). Smaller pieces are copied at once.
_PIECE_BYTES = 64 * 1024


def _pieces(x: Any) -> list[Any]:
  """`x` flattened and cut into pieces of at most _PIECE_BYTES."""
  flat = x.reshape(-1)
  step = max(1, _PIECE_BYTES // max(1, np.dtype(x.dtype).itemsize))
  return [flat[i:i + step] for i in range(0, flat.shape[0], step)] or [flat]


def _varying_like(value: Any, like: Any) -> Any:
  """`value` varying over the mesh axes `like` varies over. A callback's results vary over
  none, and shard_map's type check (jax >= 0.6.1) wants a loop's carry types unchanged."""
  typeof = getattr(jax, "typeof", None)
  aval = typeof(like) if typeof is not None else None
  # aval.manual_axis_type.varying from jax 0.10; aval.vma from 0.6.1; neither before.
  manual = getattr(aval, "manual_axis_type", None)
  axes = tuple(sorted(manual.varying if manual is not None else getattr(aval, "vma", ())))
  if not axes:
    return value
  # pcast(to="varying") from jax 0.8.2, pvary from 0.6.1 (deprecated in 0.8.2).
  cast = getattr(lax, "pcast", None)
  if cast is not None:
    return cast(value, axes, to="varying")
  pvary: Callable[..., Any] = getattr(lax, "pvary")  # noqa: B009  (gone from jax 0.10)
  return pvary(value, axes)
