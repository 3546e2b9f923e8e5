"""Eager execution: a shard_map called outside ``jit`` runs its body
primitive by primitive, with per-device values, like JAX's.

Each body value is held as one global "stacked" array of shape
``(n, *local_shape)`` whose leading dimension is split over the mesh axes the
value varies along, so every device holds its own block: with varying-axes
types on those are the value's vma axes (a replicated value is stored once),
otherwise all manual axes; a partial sum (0.10's unreduced/reduced types)
keeps those axes in the stacked array's sharding, each device's block being
its part.  Every primitive is applied by a small jitted
shard_map of ours that unstacks the blocks, binds the primitive per device and
restacks, with specs (and vma types) taken from the operands' and results'
replication.  Replication types travel with values, so outputs are checked
against ``out_specs`` and fully replicated values can be used concretely
(``bool(x)``, Python control flow).

``debug_callback`` runs the callback once per stacked block (blocks of all
operands zipped, in mesh order); an explicit device in ``device_put`` is
rejected, both as in JAX's eager shard_map.
"""
from __future__ import annotations

import contextlib
from typing import Any
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax._src import api_util
from jax._src import core
from jax._src import debugging
from jax._src import dispatch
from jax._src import linear_util as lu
from jax._src import util
from jax._src.mesh import AbstractMesh, Mesh, get_abstract_mesh, use_abstract_mesh
from jax.sharding import NamedSharding, PartitionSpec

from shard_map_impl import errors, replication
from shard_map_impl.binding import bind_body
from shard_map_impl.jax_line import (EAGER_INLINES_CALLS, EAGER_PARTIAL_AUTO,
                                     EAGER_PARTIAL_RESULT_BY_SPEC, EAGER_PARTIAL_SUMS_REFUSAL,
                                     EAGER_REFUSED_REF_PRIMITIVES, EAGER_REFUSED_SUM_PRIMITIVES, check_flag_value,
                                     debug_print_p, eager_default_mesh, get_aval,
                                     jax_eager_trace_type, partial_sums_of, spec_entries,
                                     trace_to_jaxpr, with_manual_type, with_spec_partial_sums)
from shard_map_impl.out_names import ConstThunk, DerivedNames
from shard_map_impl.per_device import body_context, manual_axes_of, manual_mesh, vma_enabled
from shard_map_impl.primitive import register_trace_rule
from shard_map_impl.specs import (NO_SUMS, AnyMesh, AxisNames, OutNamesThunk, axis_tuple,
                                  canonicalize_spec, names_to_pspec, partial_sums)
from shard_map_impl.staging import output_rank_failures


# --- converting between global arrays and stacked per-device blocks ------------

def _flat_program(fn: Callable[..., Sequence[Any]], mesh: AnyMesh, auto: frozenset,
                  in_specs: Sequence[PartitionSpec],
                  out_specs: PartitionSpec | Sequence[PartitionSpec], check: bool) -> Callable:
  """A shard_map of ours running ``fn`` (flat list in, flat list out) per device.

  ``out_specs`` is one spec per output, or a single spec shared by them all.
  """
  in_names = tuple(canonicalize_spec(s) for s in in_specs)
  shared: AxisNames | None = None
  per_output: tuple[AxisNames, ...] = ()
  if isinstance(out_specs, PartitionSpec):
    shared = canonicalize_spec(out_specs)
  else:
    per_output = tuple(canonicalize_spec(s) for s in out_specs)

  def program(*args: Any):
    n_outs: list[int] = []  # known once the body has been traced

    def body(*blocks: Any):
      outs = fn(*blocks)
      n_outs.append(len(outs))
      return outs

    dbg = api_util.debug_info("shard_map", fn, args, {})
    names: DerivedNames | ConstThunk = ConstThunk(per_output)
    if shared is not None:
      one = shared
      names = DerivedNames(lambda: (one,) * n_outs[-1], ("shared", out_specs, fn))
    return bind_body(lu.wrap_init(body, debug_info=dbg), args, mesh=mesh,
                     in_names=in_names, out_names_thunk=names, check_rep=check,
                     auto=auto)
  return program


@util.cache(max_size=1024, trace_context_in_key=False)
def _converter(kind: str, mesh: AnyMesh, auto: frozenset, spec: PartitionSpec,
               stacked: PartitionSpec, check: bool):
  """Jitted global<->stacked conversion (a shard_map of ours, cached)."""
  if kind == "stack":
    convert = _flat_program(_stack_block, mesh, auto, (spec,), (stacked,), check)
    return jax.jit(lambda x: convert(x)[0])
  convert = _flat_program(_unstack_block, mesh, auto, (stacked,), (spec,), check)
  if auto and not EAGER_PARTIAL_RESULT_BY_SPEC:  # as JAX: the compiler places it
    return jax.jit(lambda x: convert(x)[0])
  return jax.jit(lambda x: convert(x)[0], out_shardings=NamedSharding(mesh, spec))


def _stack_block(block: Any):
  return [block[None]]


def _unstack_block(block: Any):
  return [block[0]]


@contextlib.contextmanager
def _outside(context_mesh: AbstractMesh):
  """Leave the body: evaluate with jit enabled under the caller's mesh."""
  with core.eval_context(), jax.disable_jit(False), use_abstract_mesh(context_mesh):
    yield


class _PrimApplier:
  """Hashable per-device application of one primitive (a jit cache key)."""

  def __init__(self, prim: core.Primitive, params: dict):
    self.prim, self.params = prim, params
    self.key: tuple[core.Primitive, tuple[tuple[str, Any], ...]] | None
    try:
      self.key = (prim, tuple(sorted(params.items())))
      hash(self.key)
    except TypeError:  # unhashable params: no caching across calls
      self.key = None

  def __hash__(self):
    return hash(self.key) if self.key is not None else id(self)

  def __eq__(self, other: object):
    if self.key is None:
      return self is other
    return isinstance(other, _PrimApplier) and self.key == other.key

  def __call__(self, *blocks: Any):
    outs = self.prim.bind(*(b[0] for b in blocks), **self.params)
    outs = outs if self.prim.multiple_results else [outs]
    return [o[None] for o in outs]


@util.cache(max_size=4096, trace_context_in_key=False)
def _jitted(applier: _PrimApplier | _JaxprApplier, mesh: AnyMesh, auto: frozenset, in_specs: tuple,
            out_specs: PartitionSpec | Sequence[PartitionSpec], check: bool):
  # A tuple key stands for a list of per-output specs (a single P is a tuple too).
  return jax.jit(_flat_program(applier, mesh, auto, in_specs, out_specs, check))


class _JaxprApplier:
  """Per-device evaluation of a closed jaxpr (a nested shard_map, staged once)."""

  def __init__(self, closed: core.ClosedJaxpr):
    self.closed = closed

  def __call__(self, *blocks: Any):
    outs = core.eval_jaxpr(self.closed.jaxpr, self.closed.consts, *(b[0] for b in blocks))
    return [o[None] for o in outs]


def _apply(trace: EagerTrace, applier: _PrimApplier | _JaxprApplier, stacked: Sequence[Any],
           in_specs: tuple, out_specs: PartitionSpec | Sequence[PartitionSpec]):
  """Run ``applier`` on every device's blocks; ``out_specs`` a P or list of P."""
  out_key = tuple(out_specs) if isinstance(out_specs, list) else out_specs
  fn = _jitted(applier, trace.mesh, trace.auto, in_specs, out_key, trace.inner_check)
  with _outside(trace.context_mesh):
    return fn(*stacked)


# --- the trace ---------------------------------------------------------------

def _auto_spec(stacked: core.AbstractValue, auto: frozenset) -> PartitionSpec:
  """A block's spec: the stacked value's, less its leading (blocks) dimension, over
  the axes left to the compiler only (Explicit ones are part of the block's type)."""
  ndim = len(getattr(stacked, "shape", ())) - 1
  sharding = getattr(stacked, "sharding", None)
  entries = list(spec_entries(sharding.spec))[1:] if sharding is not None and auto else []
  kept = []
  for entry in entries + [None] * (ndim - len(entries)):
    names = tuple(a for a in axis_tuple(entry) if a in auto)
    kept.append(None if not names else names[0] if len(names) == 1 else names)
  return PartitionSpec(*kept)


class EagerTracer(core.Tracer):
  """A body value: its distinct per-device blocks stacked, plus its rep.

  The leading dimension of ``stacked`` runs over the mesh axes the value
  varies along (``trace.stack_axes(rep)``): with varying-axes types on that
  is just its vma, otherwise every manual axis.
  """
  __slots__ = ("stacked", "rep", "sums")
  _trace: EagerTrace

  def __init__(self, trace: EagerTrace, rep: frozenset | None, stacked: Any,
               sums: tuple[frozenset, frozenset] = NO_SUMS):
    self._trace = trace
    self.rep = rep
    self.stacked = stacked
    self.sums = sums  # (unreduced, reduced) axes: part of the type and the stacked sharding

  @property
  def aval(self):
    trace = self._trace
    glob = get_aval(self.stacked)
    local = core.mapped_aval(glob.shape[0], 0, glob)
    typed = vma_enabled(trace.check) and check_flag_value()
    vma = (replication.rep_to_vma(trace.mesh, trace.auto, self.rep) - frozenset().union(*self.sums)
           if typed else frozenset())
    return with_manual_type(local, vma, self.sums if typed else NO_SUMS,
                            sharding=NamedSharding(manual_mesh(trace.mesh, trace.auto),
                                                   _auto_spec(glob, trace.auto)))

  def to_concrete_value(self):
    if self.rep is not None and self.rep >= frozenset(self._trace.mesh.axis_names):
      with _outside(self._trace.context_mesh):
        return core.to_concrete_value(self.stacked[0])
    return None

  def __str__(self) -> str:
    trace = self._trace
    mesh = trace.mesh
    with _outside(trace.context_mesh):
      blocks = list(self.stacked)
    names = "(" + ", ".join(map(str, mesh.axis_names)) + ",)"
    lines = []
    for coords, dev in np.ndenumerate(mesh.devices):
      at = dict(zip(mesh.axis_names, coords, strict=True))
      block = blocks[_block_index(trace, self.rep, self.sums, at)]
      lines.append(f"On {dev} at mesh coordinates {names} = {coords}:\n{block}\n")
    return "\n".join(lines)

  __repr__ = __str__


class EagerTrace(core.Trace):
  """Trace of an eagerly executing shard_map body."""

  def __init__(self, mesh: Mesh, auto: frozenset, check: bool, context_mesh: AbstractMesh):
    super().__init__()
    self.mesh, self.auto, self.check = mesh, auto, check
    self.context_mesh = context_mesh
    self.typed = vma_enabled(check)  # fixed at entry, like JAX
    self.inner_check = self.typed

  def stack_axes(self, rep: frozenset | None, sums: tuple[frozenset, frozenset] = NO_SUMS
                 ) -> tuple:
    manual = manual_axes_of(self.mesh, self.auto)
    if not self.typed:
      return manual
    partial = frozenset().union(*sums)
    return tuple(a for a in manual if (rep is None or a not in rep) and a not in partial)

  def stack_spec(self, rep: frozenset | None, sums: tuple[frozenset, frozenset] = NO_SUMS
                 ) -> PartitionSpec:
    """Sharding of a stacked value: blocks split over its varying axes; a partial
    sum's axes stay unreduced/reduced (each device's block is its partial value)."""
    return with_spec_partial_sums(PartitionSpec(self.stack_axes(rep, sums)), *sums)

  def constant_rep(self):
    return frozenset(self.mesh.axis_names) if self.typed else None

  def lift(self, value: Any) -> tuple[Any, Any, tuple[frozenset, frozenset]]:
    """(stacked value, rep, partial sums) for a tracer of ours or a constant."""
    if isinstance(value, EagerTracer) and value._trace is self:
      return value.stacked, value.rep, value.sums
    if isinstance(value, core.Tracer):
      raise TypeError(f"shard_map body received a tracer from another "
                      f"transformation: {value}")
    rep = self.constant_rep()
    with _outside(self.context_mesh):
      stacked = _converter("stack", self.mesh, self.auto, PartitionSpec(),
                           self.stack_spec(rep), self.inner_check)(value)
    return stacked, rep, NO_SUMS

  def stage_value(self, value: Any) -> EagerTracer:
    """A constant lifted into the body (0.10 asks traces for this directly)."""
    stacked, rep, sums = self.lift(value)
    return EagerTracer(self, rep, stacked, sums)

  def _out_reps(self, prim: core.Primitive, tracers: Sequence[Any],
                in_reps: Sequence[frozenset | None], params: dict[str, Any]):
    """(reps, partial sums) of the outputs; sums are None where untyped."""
    if not self.check:
      return _UNCHECKED, None
    if self.typed:
      avals, _ = prim.abstract_eval(*(core.typeof(t) for t in tracers), **params)
      avals = avals if prim.multiple_results else [avals]
      return _typed_kinds(self, avals)
    rule = replication.rep_rules.get(prim)
    if rule is None:
      raise replication.missing_rule(prim)
    return rule(self.mesh, *in_reps, **params), None

  def process_primitive(self, prim: core.Primitive, tracers: Sequence[Any], params: dict[str, Any]):
    if prim in EAGER_REFUSED_REF_PRIMITIVES:  # before its (ref) result is typed
      raise ValueError("Eager shard_map cannot return a `jax.Ref`. Please wrap your "
                       "shard_map in `jax.jit`.")
    if prim in EAGER_REFUSED_SUM_PRIMITIVES:
      raise NotImplementedError(EAGER_PARTIAL_SUMS_REFUSAL)
    lifted = [self.lift(t) for t in tracers]
    stacked = [s for s, _, _ in lifted]
    in_reps = [r for _, r, _ in lifted]
    reps, sums = self._out_reps(prim, tracers, in_reps, params)
    eager_rule = _eager_rules.get(prim)
    if eager_rule is not None:
      outs = eager_rule(self, stacked, in_reps, **params)
    else:
      in_specs = tuple(self.stack_spec(r, s) for _, r, s in lifted)
      out_specs: list[PartitionSpec] | PartitionSpec
      if self.typed:  # blocks stacked over exactly the outputs' vma
        out_specs = [self.stack_spec(r, s) for r, s in zip(reps, sums, strict=True)]
      else:
        out_specs = self.stack_spec(None)
      outs = _apply(self, _PrimApplier(prim, params), stacked, in_specs, out_specs)
    if not self.typed:
      reps = _broadcast_reps(prim, reps, len(outs))
    results = [EagerTracer(self, r, o, s)
               for r, o, s in zip(reps, outs, sums or [NO_SUMS] * len(outs), strict=True)]
    return results if prim.multiple_results else results[0]

  def process_custom_jvp_call(self, prim: core.Primitive, fun: lu.WrappedFun, jvp: lu.WrappedFun,
                              tracers:
                              Sequence[Any], *, symbolic_zeros: bool):
    del prim, jvp, symbolic_zeros  # eager: just run the primal function
    with core.set_current_trace(self):
      return fun.call_wrapped(*tracers)

  def process_custom_vjp_call(self, prim: core.Primitive, fun: lu.WrappedFun, fwd: lu.WrappedFun,
                              bwd: lu.WrappedFun,
                              tracers: Sequence[Any], out_trees: Callable, symbolic_zeros: bool):
    del prim, fwd, bwd, out_trees, symbolic_zeros
    with core.set_current_trace(self):
      return fun.call_wrapped(*tracers)

  def process_shard_map(self, prim: core.Primitive, fun: Any, tracers: Sequence[Any],
                        **params: Any) -> Any:
    # How JAX 0.10 binds its own shard_map on a trace (0.6 never calls this).
    return _nested_jax_shard_map(self, prim, fun, tracers, **params)

  def process_call(self, call_primitive: core.Primitive, fun: lu.WrappedFun, tracers: Sequence[Any],
                   params: dict[str, Any]):
    if EAGER_INLINES_CALLS:
      with core.set_current_trace(self):
        return fun.call_wrapped(*tracers)
    raise NotImplementedError(
        f"Eager evaluation of `{call_primitive}` inside a `shard_map` isn't "
        "supported. Put a `jax.jit` around the `shard_map`-decorated function.")

  def process_map(self, map_primitive: core.Primitive, fun: lu.WrappedFun, tracers: Sequence[Any],
                  params: dict[str, Any]):
    raise NotImplementedError(
        "Eager evaluation of `pmap` inside a `shard_map` isn't supported. Put a "
        "`jax.jit` around the `shard_map`-decorated function.")


_UNCHECKED = object()  # rep results when check_rep=False: nothing known


def _broadcast_reps(prim: core.Primitive, reps: Sequence[frozenset | None], n_out: int) -> list:
  if reps is _UNCHECKED:
    return [frozenset()] * n_out
  if not prim.multiple_results:
    return [reps]
  return list(reps) if isinstance(reps, (list, tuple)) else [reps] * n_out


# --- primitives with their own eager behaviour ----------------------------------

def _debug_callback_eager(trace: EagerTrace, stacked: Sequence[Any], reps: Sequence[Any], *,
                          callback: Callable[..., Any], effect: Any, partitioned: bool,
                          **_: Any):
  """One callback per stacked block, blocks of all operands zipped (as JAX)."""
  del reps, effect, partitioned
  with _outside(trace.context_mesh):
    per_arg = [list(s) for s in stacked]
  for blocks in zip(*per_arg, strict=True):
    callback(*blocks)
  return []


def _debug_print_eager(trace: EagerTrace, stacked: Sequence[Any], reps: Sequence[Any],
                       **params: Any):
  """0.10's debug_print: its own impl (format and print) once per stacked block."""
  del reps
  with _outside(trace.context_mesh):
    per_arg = [list(s) for s in stacked]
  assert debug_print_p is not None  # registered only where it exists
  for blocks in zip(*per_arg, strict=True):
    debug_print_p.impl(*blocks, **params)
  return []


def _block_index(trace: EagerTrace, rep: frozenset | None, sums: tuple[frozenset, frozenset],
                 at: dict) -> int:
  """Row-major position of a device's block among a value's varying axes."""
  flat = 0
  for a in trace.stack_axes(rep, sums):
    flat = flat * trace.mesh.shape[a] + at[a]
  return flat


def _device_put_eager(trace: EagerTrace, stacked: Sequence[Any], reps: Sequence[Any], *,
                      devices: Sequence[Any], srcs: Sequence[Any], copy_semantics: Sequence[Any]):
  del trace, reps, srcs, copy_semantics
  for d in devices:
    if d is not None:
      raise ValueError("device_put with explicit device not allowed within "
                       f"shard_map-decorated functions, but got device {d}")
  return list(stacked)


_eager_rules: dict[core.Primitive, Callable[..., list]] = {
    debugging.debug_callback_p: _debug_callback_eager,
    dispatch.device_put_p: _device_put_eager,
}
if debug_print_p is not None:
  _eager_rules[debug_print_p] = _debug_print_eager


# --- a shard_map nested in an eager body ----------------------------------------

def _run_staged(trace: EagerTrace, staged: lu.WrappedFun, tracers: Sequence[Any]) -> list:
  """Stage ``staged`` (a nested shard_map) once on per-device avals, then run it on
  every device's blocks like a primitive; replication follows from its types."""
  jaxpr, out_avals, consts = trace_to_jaxpr(staged, [core.typeof(t) for t in tracers])
  lifted = [trace.lift(t) for t in tracers]
  in_reps = [r for _, r, _ in lifted]
  sums = [NO_SUMS] * len(out_avals)
  if not trace.check:
    reps: list[frozenset] = [frozenset()] * len(out_avals)
  elif trace.typed:
    reps, sums = _typed_kinds(trace, out_avals)
  else:
    reps = replication.jaxpr_replication(trace.mesh, jaxpr, in_reps)
  in_specs = tuple(trace.stack_spec(r, s) for _, r, s in lifted)
  out_specs = ([trace.stack_spec(r, s) for r, s in zip(reps, sums, strict=True)] if trace.typed
               else trace.stack_spec(None))
  outs = _apply(trace, _JaxprApplier(core.ClosedJaxpr(jaxpr, consts)),
                [s for s, _, _ in lifted], in_specs, out_specs)
  return [EagerTracer(trace, r, o, s) for r, o, s in zip(reps, outs, sums, strict=True)]


def _typed_kinds(trace: EagerTrace, avals: Sequence[core.AbstractValue]) -> tuple[list, list]:
  """(reps, partial sums) of typed per-device values: a partial sum is not replicated."""
  return ([replication.aval_to_rep(trace.mesh, trace.auto, a) for a in avals],
          [partial_sums_of(a) for a in avals])


@register_trace_rule(EagerTrace)
def _nested(trace: EagerTrace, prim: core.Primitive, fun: lu.WrappedFun, tracers: Sequence[Any],
            **bind_params: Any):
  """A shard_map of ours inside an eager body."""
  staged = lu.wrap_init(lambda *xs: prim.bind(fun, *xs, **bind_params),
                        debug_info=fun.debug_info)
  return _run_staged(trace, staged, tracers)


def _nested_jax_shard_map(trace: EagerTrace, prim: core.Primitive, fun: Any,
                          tracers: Sequence[Any], **params: Any) -> Any:
  """JAX's own (core) shard_map inside an eager body of ours (where its bind yields a
  FlatTree, the results go back in one)."""
  results: list = []
  def staged(*xs: Any):
    out = (prim.bind(*xs, subfuns=(fun,), **params) if "debug_info" in params
           else prim.bind(fun, *xs, **params))
    results.append(out)
    return list(out)
  debug_info: Any = params.get("debug_info") or fun.debug_info
  outs = _run_staged(trace, lu.wrap_init(staged, debug_info=debug_info), tracers)
  update = getattr(results[-1], "update", None)
  return outs if update is None else update(outs)


def _inside_jax_eager(trace: core.Trace, prim: core.Primitive, fun: lu.WrappedFun,
                      tracers: Sequence[Any], **bind_params: Any):
  """Ours inside JAX 0.10's eager shard_map body: staged once, then run there as a
  jitted call (which JAX's eager trace applies per device)."""
  staged = lu.wrap_init(lambda *xs: prim.bind(fun, *xs, **bind_params),
                        debug_info=fun.debug_info)
  jaxpr, _, consts = trace_to_jaxpr(staged, [core.typeof(t) for t in tracers])
  closed = core.ClosedJaxpr(jaxpr, consts)
  with core.set_current_trace(trace):
    return jax.jit(core.jaxpr_as_fun(closed))(*tracers)


if jax_eager_trace_type is not None:
  register_trace_rule(jax_eager_trace_type)(_inside_jax_eager)


# --- entry: binding shard_map_p outside any transformation ----------------------

def _concrete_mesh(mesh: AnyMesh, args: Sequence[Any]) -> Mesh:
  """An AbstractMesh is resolved from the arguments' NamedShardings."""
  found = mesh
  for x in args:
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, NamedSharding):
      if sharding.mesh.shape_tuple != mesh.shape_tuple:
        raise ValueError(
            f"Mesh shape of the input {sharding.mesh.shape_tuple} does not match "
            f"the mesh shape passed to shard_map {mesh.shape_tuple} for shape "
            f"{core.shaped_abstractify(x).str_short()}")
      found = sharding.mesh
  if isinstance(found, AbstractMesh):
    raise ValueError(
        "Please pass `jax.Array`s with a `NamedSharding` as input to "
        "`shard_map` when passing `AbstractMesh` to the mesh argument.")
  return found


def _refuse_partial_sums(names: Sequence[AxisNames]) -> None:
  """Unreduced/reduced specs, where JAX's eager shard_map refuses them (with its words)."""
  if EAGER_PARTIAL_SUMS_REFUSAL and any(any(partial_sums(n)) for n in names):
    raise NotImplementedError(EAGER_PARTIAL_SUMS_REFUSAL)


@register_trace_rule(core.EvalTrace)
def _eager(trace: EagerTrace, prim: core.Primitive, fun: lu.WrappedFun, args: Sequence[Any], *,
           mesh: AnyMesh,
           in_names: Sequence[AxisNames], out_names_thunk: OutNamesThunk, check_rep: bool,
           rewrite: bool, auto: frozenset):
  del trace, prim, rewrite
  if auto and not EAGER_PARTIAL_AUTO:  # as JAX 0.6: partially-auto ones need a jit
    raise NotImplementedError(
        "Eager evaluation of a shard_map with auto axes isn't supported; put a "
        "`jax.jit` around the `shard_map`-decorated function.")
  if isinstance(mesh, AbstractMesh):
    mesh = _concrete_mesh(eager_default_mesh() or mesh, args)
  _refuse_partial_sums(in_names)
  context = get_abstract_mesh()
  etrace = EagerTrace(mesh, auto, check_rep, context)
  in_reps = [replication.in_names_to_rep(mesh, n) for n in in_names]
  in_sums = [partial_sums(n) if etrace.typed else NO_SUMS for n in in_names]
  with _outside(context):
    # JAX's eager shard_map enters each argument through jax.shard_map itself, whose
    # check of inputs against specs (fully manual over Explicit axes) applies here too.
    errors.check_inputs_match_specs(mesh, errors.manual_names(mesh, auto),
                                    [names_to_pspec(n) for n in in_names], args)
    stacked = [_converter("stack", mesh, auto, names_to_pspec(n), etrace.stack_spec(r, u),
                          etrace.inner_check)(x)
               for n, r, u, x in zip(in_names, in_reps, in_sums, args, strict=True)]
  tracers = [EagerTracer(etrace, r, s, u)
             for r, s, u in zip(in_reps, stacked, in_sums, strict=True)]
  with core.set_current_trace(etrace), body_context(mesh, auto, check_rep):
    outs = fun.call_wrapped(*tracers)
    out_pairs = [etrace.lift(o) for o in outs]
  out_names = tuple(out_names_thunk())
  _refuse_partial_sums(out_names)
  local_avals = [core.mapped_aval(s.shape[0], 0, get_aval(s)) for s, _, _ in out_pairs]
  fails = output_rank_failures(out_names, local_avals)
  if any(f is not None for f in fails):
    raise errors.OutputRankError(fails)
  if check_rep:
    fails = [None if replication.rep_is_sufficient(mesh, auto, r, n)
             else errors.Unproven(r, frozenset().union(*u))
             for (_, r, u), n in zip(out_pairs, out_names, strict=True)]
    if any(f is not None for f in fails):
      raise errors.OutputReplicationError(fails)
  with _outside(context):
    return [_converter("unstack", mesh, auto, names_to_pspec(n), etrace.stack_spec(r, u),
                       etrace.inner_check)(s)
            for n, (s, r, u) in zip(out_names, out_pairs, strict=True)]
