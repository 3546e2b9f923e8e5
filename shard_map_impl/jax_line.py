"""The one place that knows which JAX line (0.6.0 or 0.10.2) is installed.

Everything the rule modules need that moved, was renamed or behaves
differently between the two supported releases is defined here once, under a
line-neutral name.  Rule modules import these names and never look at
``jax.__version__`` themselves.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
from jax._src import config
from jax._src import core
from jax._src import custom_derivatives as cd
from jax._src import debugging
from jax._src import dtypes
from jax._src import pjit
from jax._src import sharding_impls
from jax._src.interpreters import mlir
from jax._src.interpreters import partial_eval as pe

# 0.10 is the line whose internals this module calls "new"; 0.6 the legacy one.
NEW_LINE = tuple(int(p) for p in jax.__version__.split(".")[:2]) >= (0, 10)

# --- moved modules and primitives --------------------------------------------

if NEW_LINE:
  from jax._src.random import prng  # noqa: F401  (re-exported)
  from jax._src import shard_map as _jax_shard_map  # type: ignore[attr-defined, unused-ignore]  # other JAX line
  jit_p: core.Primitive = pjit.jit_p  # type: ignore[attr-defined, unused-ignore]  # other JAX line
else:
  from jax._src import prng  # type: ignore[no-redef, unused-ignore]  # noqa: F401
  from jax.experimental import shard_map as _jax_shard_map  # type: ignore[no-redef, unused-ignore]
  jit_p = pjit.pjit_p  # type: ignore[attr-defined, unused-ignore]

jax_shard_map_p: core.Primitive = _jax_shard_map.shard_map_p
# The trace of JAX's eager shard_map bodies where ours may be bound (0.10; 0.6: none).
jax_eager_trace_type: type | None = getattr(_jax_shard_map, "ShardMapTrace", None) if NEW_LINE else None

# 0.10's own debug-print primitive (0.6 prints through debug_callback).
debug_print_p: core.Primitive | None = getattr(debugging, "debug_print_p", None)

# Primitives that exist on one line only (absent ones are simply not listed).
mesh_cast_prims: tuple[core.Primitive, ...] = tuple(
    p for p in (getattr(pjit, "mesh_cast_p", None), getattr(pjit, "reshard_p", None))
    if p is not None)
# 0.6's jaxpr-form custom_vjp (only the untyped rewrite mode, a 0.6 mode, needs it).
custom_vjp_call_jaxpr_p: core.Primitive | None = getattr(cd, "custom_vjp_call_jaxpr_p", None)
custom_vjp_prims: tuple[core.Primitive, ...] = tuple(
    p for p in (getattr(cd, "custom_vjp_call_jaxpr_p", None),
                getattr(cd, "custom_vjp_call_p", None))
    if p is not None)

# --- public API conventions ------------------------------------------------------

# The check flag's public name, as error messages spell it.
CHECK_ARG = "check_vma" if NEW_LINE else "check_rep"
# 0.10: a fully manual shard_map over Explicit axes takes inputs only as in_specs
# shard them (0.6 reshards them).
INPUTS_MUST_MATCH_EXPLICIT_SPECS = NEW_LINE


def without_size_one_axes(spec: Any, mesh: Any) -> Any:
  """``spec`` as 0.10 types it: size-1 mesh axes dropped where its config says so."""
  if NEW_LINE and config.remove_size_one_mesh_axis_from_type.value:  # type: ignore[attr-defined, unused-ignore]
    from jax._src.named_sharding import remove_size_one_mesh_axis  # type: ignore[attr-defined, unused-ignore]
    return remove_size_one_mesh_axis(spec, mesh)
  return spec


# A residual replicated along every axis: spec P() on 0.10, {0: ()} on 0.6.
RESIDUAL_SPEC_OMITS_UNSPLIT_DIM = NEW_LINE
# Error messages in 0.10's vocabulary (manual / varying axes, `jax.shard_map`).
WORDING_0_10 = NEW_LINE
# 0.10 rejects spec entries naming axes outside the mesh up front.
SPECS_NAME_MESH_AXES_ONLY = NEW_LINE
# 0.10 runs partially manual shard_maps eagerly; 0.6 asks for an enclosing jit.
EAGER_PARTIAL_AUTO = NEW_LINE
# 0.10 runs call primitives (core.call, closed_call) inside an eager body; 0.6 refuses.
EAGER_INLINES_CALLS = NEW_LINE
# 0.6 also takes a thunk for out_specs (resolved once the body is traced).
OUT_SPECS_MAY_BE_THUNKS = not NEW_LINE
# 0.10 reads in_specs=None as "no argument is mapped"; 0.6 rejects it.
IN_SPECS_NONE_MEANS_UNMAPPED = NEW_LINE
# 0.10's shard_map names its body's results result[i] by flat position.
BODY_RESULTS_BY_FLAT_INDEX = NEW_LINE
# 0.10 rejects a mesh argument that differs from the context mesh (jax.set_mesh).
CONTEXT_MESH_MUST_MATCH = NEW_LINE
# JAX's Infer (0.10): the in_specs default asking for inference.
INFER_SENTINEL: Any = getattr(_jax_shard_map, "Infer", object())

# --- the replication / varying-manual-axes check flag ------------------------

def spec_entries(spec: Any) -> tuple:
  """A PartitionSpec's per-dimension entries (0.10 refuses ``*spec`` once it has
  unreduced/reduced axes; 0.6's has no ``partitions``)."""
  return spec.partitions if NEW_LINE else tuple(spec)


# --- unreduced/reduced axes (0.10's partial-sum types; 0.6 has none) ----------

NO_AXES: frozenset = frozenset()


def spec_partial_sums(spec: Any) -> tuple[frozenset, frozenset]:
  """A PartitionSpec's (unreduced, reduced) axes (always empty on 0.6)."""
  return (frozenset(getattr(spec, "unreduced", NO_AXES)),
          frozenset(getattr(spec, "reduced", NO_AXES)))


def with_spec_partial_sums(spec: Any, unreduced: frozenset, reduced: frozenset) -> Any:
  """``spec`` with its unreduced/reduced axes replaced (0.6 only takes none)."""
  if spec_partial_sums(spec) == (unreduced, reduced):
    return spec
  assert NEW_LINE, "jax 0.6 PartitionSpecs have no unreduced/reduced axes"
  return spec.update(unreduced=unreduced, reduced=reduced)


def partial_sums_of(aval: Any) -> tuple[frozenset, frozenset]:
  """A per-device value's (unreduced, reduced) manual axes (0.10's aval type)."""
  mat = getattr(aval, "mat", None)
  if mat is None:
    return NO_AXES, NO_AXES
  return frozenset(mat.unreduced), frozenset(mat.reduced)


def cast_to_unreduced(x: Any, axes: tuple) -> Any:
  """Mark ``x`` (varying over ``axes``) as an unreduced partial sum over them."""
  from jax._src.lax import parallel as lax_parallel
  return lax_parallel.vary_unreduced_cast(x, axes)  # type: ignore[attr-defined, unused-ignore]  # other JAX line


def implicit_casts() -> bool:
  """Whether shard_map casts outputs to what out_specs declare (0.10's jax_auto_pcast)."""
  return config.auto_pcast.value if NEW_LINE else True  # type: ignore[attr-defined, unused-ignore]


def cotangent_aval(aval: Any) -> Any:
  """The aval of a cotangent of a value typed ``aval`` (0.10 swaps its unreduced and
  reduced axes: a reduced value's cotangent is an unreduced partial sum)."""
  return aval.to_ct_aval() if NEW_LINE else aval.to_tangent_aval()


def undefined_primal_aval(aval: Any) -> Any:
  """What ``ad.UndefinedPrimal`` holds for an input typed ``aval`` (0.10: its cotangent's
  type, which backward_pass checks the accumulated cotangent against)."""
  return aval.to_ct_aval() if NEW_LINE else aval


def check_flag(check: bool) -> contextlib.AbstractContextManager:
  """JAX's internal flag making collectives track varying axes (check_rep/check_vma)."""
  return config._check_vma(check) if NEW_LINE else config._check_rep(check)  # type: ignore[attr-defined]


def check_flag_value() -> bool:
  return (config._check_vma.value if NEW_LINE  # type: ignore[attr-defined, unused-ignore]
          else config._check_rep.value)  # type: ignore[attr-defined, unused-ignore]


def varying_axes_typed() -> bool:
  """Whether checked bodies type values with varying manual axes.

  Optional on 0.6 (``jax_varying_axes_in_types``), always so on 0.10.
  """
  return True if NEW_LINE else config.varying_axes_in_types.value  # type: ignore[attr-defined, unused-ignore]


# --- avals --------------------------------------------------------------------

# 0.10: a value entering a nested shard_map keeps varying over the enclosing
# body's axes; 0.6 types it by the inner in_specs alone.
SHARD_KEEPS_OUTER_VMA = NEW_LINE


def vma_of(aval: Any) -> frozenset:
  """The manual axes a per-device value may vary along (empty if untyped)."""
  if NEW_LINE:
    mat = getattr(aval, "mat", None)
    return frozenset(mat.varying) if mat is not None else frozenset()
  return frozenset(getattr(aval, "vma", frozenset()))


def with_manual_type(aval: core.ShapedArray, vma: frozenset,
                     partial_sums: tuple[frozenset, frozenset], **updates: Any
                     ) -> core.ShapedArray:
  """``aval.update(**updates)`` with its varying manual axes set to ``vma`` and its
  (unreduced, reduced) axes to ``partial_sums`` (0.6 types neither of the latter)."""
  if NEW_LINE:
    unreduced, reduced = partial_sums
    mat = core.ManualAxisType(varying=frozenset(vma), unreduced=unreduced,  # type: ignore[attr-defined, unused-ignore]  # other JAX line
                              reduced=reduced)
    return aval.update(manual_axis_type=mat, **updates)
  assert not any(partial_sums), "jax 0.6 avals have no unreduced/reduced axes"
  return aval.update(vma=frozenset(vma), **updates)


def call_shard_handler(handler: Callable, mesh: Any, auto: frozenset, check: bool,
                       names: Any, spec: Any, aval: Any) -> Any:
  """A ``core.shard_aval_handlers`` entry (e.g. refs), in its line's convention.

  0.6: ``(mesh, auto, check_rep, names, aval)``;
  0.10: ``(mesh, manual_axes, check_vma, spec, aval)``.
  """
  if NEW_LINE:
    manual = frozenset(a for a in mesh.axis_names if a not in auto)
    return handler(mesh, manual, check, spec, aval)
  return handler(mesh, auto, check, names, aval)


def call_unshard_handler(handler: Callable, mesh: Any, check: bool, names: Any, spec: Any,
                         aval: Any) -> Any:
  """A ``core.unshard_aval_handlers`` entry: names (0.6) or spec (0.10)."""
  return handler(mesh, check, spec if NEW_LINE else names, aval)


def vmapped_mesh_axes() -> frozenset:
  """Mesh axes an enclosing vmap maps over explicitly (0.10; none on 0.6)."""
  env = core.get_axis_env()
  return frozenset(getattr(env, "explicit_mesh_axis_names", ()))


def get_aval(x: Any) -> core.AbstractValue:
  return core.typeof(x) if NEW_LINE else core.get_aval(x)  # type: ignore[attr-defined, unused-ignore]


# --- binding a primitive whose first operand is a function -------------------

def eager_default_mesh() -> Any:
  """The concrete mesh an eager shard_map on an AbstractMesh starts from, or None.

  0.10: the context mesh of ``jax.set_mesh`` (arguments' meshes still win);
  0.6: none, the arguments must name it.
  """
  if not NEW_LINE:
    return None
  from jax._src import mesh as mesh_lib
  found = mesh_lib.get_concrete_mesh()
  return None if found is None or found.empty else found


def split_bind(args: Sequence[Any], params: dict[str, Any]) -> tuple[Any, list, dict]:
  """(body, operands, params) of a ``bind`` call in either line's convention.

  0.6 passes the body as the first operand; 0.10's jaxpr interpreters pass it
  as ``subfuns=(body,)``.
  """
  if "subfuns" in params:
    params = dict(params)
    body, = params.pop("subfuns")
    return body, list(args), params
  return args[0], list(args[1:]), params


def bind_params_of(body: Any, bind_params: dict[str, Any]) -> Any:
  """What ``Primitive.get_bind_params`` returns for ``body`` and ``bind_params``."""
  if NEW_LINE:
    return dict(bind_params, subfuns=(body,))
  return [body], bind_params


def bind_on_current_trace(rule: Callable[[core.Trace], Any]) -> Any:
  """Run ``rule(trace)`` with the current trace taken (outer code sees eval)."""
  with core.take_current_trace() as trace:
    return rule(trace)


# --- staging into a jaxpr -----------------------------------------------------

def trace_to_jaxpr(fun: Any, in_avals: Sequence[core.AbstractValue]
                   ) -> tuple[core.Jaxpr, list, list]:
  """(jaxpr, out avals, consts) of ``fun`` (an ``lu.WrappedFun``)."""
  traced = pe.trace_to_jaxpr_dynamic(fun, list(in_avals))
  if not NEW_LINE:
    jaxpr, out_avals, consts, attrs = traced  # type: ignore[misc, unused-ignore]
    if attrs:
      raise NotImplementedError("shard_map bodies may not mutate jax attrs")
    return jaxpr, out_avals, consts
  jaxpr, out_avals, consts = traced  # type: ignore[misc, unused-ignore]
  return jaxpr, out_avals, consts


def to_jaxpr_tracer(trace: pe.DynamicJaxprTrace, x: Any, source_info: Any) -> Any:
  if NEW_LINE:  # 0.10 stages only canonical constants (no raw numpy arrays)
    if not isinstance(x, core.Tracer):
      x = dtypes.canonicalize_value(x)  # type: ignore[attr-defined, unused-ignore]  # other JAX line
    return trace.to_jaxpr_tracer(x, source_info)  # type: ignore[call-arg, unused-ignore]
  return trace.to_jaxpr_tracer(x)


def emit_eqn(trace: pe.DynamicJaxprTrace, in_tracers: Sequence[Any],
             out_avals: Sequence[core.AbstractValue], prim: core.Primitive,
             params: dict[str, Any], effects: Any, source_info: Any) -> list:
  """Add one equation to ``trace``'s jaxpr; returns its output tracers."""
  if NEW_LINE:
    return trace.emit_eqn(list(in_tracers), list(out_avals), prim, params,  # type: ignore[attr-defined, unused-ignore]
                          effects, source_info)
  outs = [pe.DynamicJaxprTracer(trace, a, source_info) for a in out_avals]
  eqn = pe.new_jaxpr_eqn([trace.getvar(t) for t in in_tracers],  # type: ignore[attr-defined, unused-ignore]
                         [trace.makevar(t) for t in outs], prim, params,  # type: ignore[attr-defined, unused-ignore]
                         effects, source_info)
  trace.frame.add_eqn(eqn)
  return outs


def body_effects(jaxpr: core.Jaxpr, axis_names: Sequence[Any]) -> Any:
  """The effects a shard_map equation with this body has outside."""
  effects = core.positional_effects(jaxpr) if NEW_LINE else jaxpr.effects  # type: ignore[attr-defined, unused-ignore]
  return core.filter_named_axis_effects(effects, axis_names)


@contextlib.contextmanager
def no_context() -> Iterator[None]:
  yield


# --- lowering -------------------------------------------------------------------

# On 0.10 a Shardy manual computation takes the dimension variables, effect
# tokens and hoisted jaxpr constants as leading region arguments; on 0.6 the
# region sees dimension variables from outside and threads no tokens.
SHARDY_REGION_THREADS_STATE = NEW_LINE


def ir_type(module_ctx: Any, aval: core.AbstractValue) -> Any:
  if NEW_LINE:
    return mlir.aval_to_ir_type(module_ctx, aval)  # type: ignore[call-arg, unused-ignore]
  return mlir.aval_to_ir_type(aval)  # type: ignore[call-arg, unused-ignore]


def jaxpr_constants(jaxpr: core.Jaxpr) -> list[tuple[Any, core.AbstractValue]]:
  """Large constants held in the jaxpr's literals, lowered as arguments (0.10)."""
  return list(core.jaxpr_const_args(jaxpr)) if NEW_LINE else []  # type: ignore[attr-defined, unused-ignore]


def lower_inline(ctx: Any, module_ctx: Any, jaxpr: core.Jaxpr, tokens: Any,
                 args: Sequence[Any], *, dim_var_values: Sequence[Any],
                 const_lowering: dict | None = None) -> tuple[Sequence[Any], Any]:
  """``jaxpr`` lowered in place (inside the current insertion point)."""
  if NEW_LINE:
    return mlir.jaxpr_subcomp(  # type: ignore[call-arg, unused-ignore]  # other JAX line
        module_ctx, jaxpr, ctx.name_stack, tokens, (), *args, dim_var_values=dim_var_values,
        const_lowering=ctx.const_lowering if const_lowering is None else const_lowering,
        outer_traceback=None)
  return mlir.jaxpr_subcomp(module_ctx, jaxpr, ctx.name_stack, tokens, (), *args,
                            dim_var_values=dim_var_values)


def lower_call(ctx: Any, name: str, jaxpr: core.Jaxpr, module_ctx: Any,
               avals_in: Sequence[Any], avals_out: Sequence[Any], args: Sequence[Any],
               arg_names: Sequence[str], result_names: Sequence[str]) -> tuple[Any, Any]:
  """``jaxpr`` lowered as a called function ``name``; (outputs, tokens out)."""
  # Closed here, not by pe.close_jaxpr (which 0.6's call_lowering applies to a bare
  # Jaxpr): that cache is keyed weakly on the jaxpr but its value holds the jaxpr, so
  # every body ever lowered would stay alive until evicted (~27 KB per fresh pmap).
  closed = core.ClosedJaxpr(jaxpr, ())
  if NEW_LINE:
    return mlir.call_lowering(  # type: ignore[call-arg, unused-ignore]  # other JAX line
        name, closed, None, module_ctx, avals_in, avals_out, ctx.tokens_in,  # type: ignore[arg-type, unused-ignore]  # other JAX line
        *args, dim_var_values=ctx.dim_var_values, const_lowering=ctx.const_lowering,
        arg_names=list(arg_names), result_names=list(result_names))
  return mlir.call_lowering(
      name, ctx.name_stack, closed, None, module_ctx, avals_in, avals_out, ctx.tokens_in,
      *args, dim_var_values=ctx.dim_var_values, arg_names=list(arg_names),
      result_names=list(result_names))


def build_sdy_shardings(module_ctx: Any, shardings: Sequence[Any]) -> Any:
  """The attribute listing one Shardy sharding per operand/result."""
  if NEW_LINE:
    return sharding_impls.SdyArrayList(tuple(shardings)).build(  # type: ignore[attr-defined, unused-ignore]
        module_ctx.sharding_attr_cache)
  return sharding_impls.SdyArrayShardingList(list(shardings)).build()  # type: ignore[attr-defined, unused-ignore]


def region_sharding(mesh: Any, spec: Any, outer_manual: frozenset) -> Any:
  """The NamedSharding of a region operand, axes manual outside marked so."""
  from jax.sharding import NamedSharding
  if NEW_LINE:
    from jax._src.mesh import AxisType
    abstract = mesh.abstract_mesh
    if outer_manual:
      abstract = abstract.update_axis_types({a: AxisType.Manual for a in outer_manual})
    return NamedSharding(abstract, spec)
  return NamedSharding(mesh, spec, _manual_axes=outer_manual)  # type: ignore[call-arg, unused-ignore]


def gspmd_conversion_axes(manual: frozenset, newly_manual: Sequence[Any]) -> Any:
  """The axes whose total size decides whether GSPMD converts to/from manual.

  0.6 counts every manual axis of the region, 0.10 only those it makes manual.
  """
  return newly_manual if NEW_LINE else manual


def region_is_partial(mesh: Any, auto: frozenset, newly_manual: frozenset) -> bool:
  """Whether a region leaves array dimensions open to the compiler.

  0.6 does so where the shard_map has auto axes; 0.10 wherever the region
  itself makes fewer than all mesh axes manual (also nested in another).
  """
  return len(newly_manual) < len(mesh.axis_names) if NEW_LINE else bool(auto)


def sdy_region_sharding(sharding: Any, ndim: int, partially_manual: bool) -> Any:
  """Shardy sharding of a region operand; auto axes may shard open dimensions."""
  if NEW_LINE:
    return sharding._to_sdy_sharding(ndim, modify_wrt_axis_types=partially_manual)
  result = sharding._to_sdy_sharding(ndim)
  if partially_manual:
    for dim in result.dimension_shardings:
      if not dim.axes:
        dim.is_open = True  # let the compiler shard auto axes here
  return result


# --- transformation rules (autodiff, partial eval, DCE, discharge, vmap) ------

def linearize_subtrace(fun: Any, trace: Any, nonzero_in: Sequence[bool],
                       debug_info: core.DebugInfo) -> tuple[Any, Callable]:
  """JAX's per-body linearization of ``fun`` under ``trace``: (primal fun, aux thunk).

  The primal fun returns the non-forwarded residuals, then the primal outputs;
  aux is ``(res_avals, nonzero_out, lin_jaxpr, env, in_fwd, out_fwd)``.
  0.10 also threads whether the linearization feeds a VJP.
  """
  from jax._src.interpreters import ad
  if NEW_LINE:
    return ad.linearize_subtrace(fun, trace.is_vjp, trace.tag, nonzero_in, debug_info)
  return ad.linearize_subtrace(fun, trace.tag, nonzero_in, debug_info)


def new_eqn_recipe(trace: pe.JaxprTrace, in_tracers: Sequence[Any], out_tracers: Sequence[Any],
                   prim: core.Primitive, params: dict[str, Any], effects: Any,
                   source_info: Any) -> Any:
  """A partial-eval equation recipe (0.10 also takes the trace)."""
  make: Any = pe.new_eqn_recipe  # its signature differs per line
  if NEW_LINE:
    return make(trace, in_tracers, out_tracers, prim, params, effects, source_info)
  return make(in_tracers, out_tracers, prim, params, effects, source_info)


def eqn_effects(jaxpr: core.Jaxpr, invars: Sequence[Any], axis_names: Sequence[Any]) -> Any:
  """Effects of an equation applying body ``jaxpr`` to ``invars`` (for ``new_jaxpr_eqn``).

  0.10 keys input effects by the body's positions and resolves them to the
  equation's operands; 0.6 uses the body's effects as they are.
  """
  effects = core.eqn_effects(jaxpr, invars) if NEW_LINE else jaxpr.effects  # type: ignore[attr-defined, unused-ignore]
  return core.filter_named_axis_effects(effects, axis_names)


def discharge_state(jaxpr: core.Jaxpr) -> tuple[core.Jaxpr, list]:
  """``jaxpr`` with its ref inputs discharged: (pure jaxpr, its constants)."""
  from jax._src.state import discharge
  discharge_fn: Any = discharge.discharge_state  # its signature differs per line
  if NEW_LINE:
    closed = discharge_fn(core.ClosedJaxpr(jaxpr, ()))
    return closed.jaxpr, list(closed.consts)
  body, consts = discharge_fn(jaxpr, ())
  return body, list(consts)


def ragged_batch_dims() -> tuple[type, ...]:
  """Batch-dimension types for ragged vmap (0.6 only; 0.10 removed them)."""
  from jax._src.interpreters import batching
  if NEW_LINE:
    return ()
  return (batching.RaggedAxis,)


def explicit_vmap_axes(axis_data: Any) -> tuple | None:
  """Explicit mesh axes a vmap maps over (0.10; None on 0.6, whose shard_map ignores them)."""
  return axis_data.explicit_mesh_axis if NEW_LINE else None


def without_explicit_mesh_axes(axes: tuple | None) -> contextlib.AbstractContextManager:
  """Context hiding the vmapped-away explicit mesh ``axes`` (0.10)."""
  if NEW_LINE and axes:
    return core.remove_explicit_mesh_axis_names(axes)  # type: ignore[attr-defined, unused-ignore]
  return no_context()


def name_derived_body(fun: Any, rename: Callable[[Any], Any]) -> Any:
  """A body derived from a user's (jvp, linearize, partial eval, transpose half).

  0.6's shard_map traces it under names derived from the user's (``rename``);
  0.10's leaves its argument names and result paths unknown, which tracing
  errors then report as such.
  """
  return fun.with_unknown_names() if NEW_LINE else rename(fun)


# 0.10's ad.backward_pass evaluates a jaxpr's non-linear equations itself; on
# 0.6 the linear part must be split off (partial evaluation) first.
BACKWARD_PASS_EVALUATES_NONLINEAR = NEW_LINE
