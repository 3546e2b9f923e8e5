"""The one place that asks the installed JAX what it has.

JAX's internals move between releases one item at a time (0.7-0.9 mix forms of
0.6 and 0.10 and have some of their own), so there is no "line" to switch on:
each capability below is decided by asking JAX directly (an attribute, a
signature's parameters, a config flag, what a method returns), never by its
version number. Rule modules import these line-neutral names and never look at
``jax.__version__`` themselves.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
from jax._src import config
from jax._src import core
from jax._src import custom_derivatives as cd
from jax._src import debugging
from jax._src import dtypes
from jax._src import linear_util as lu
from jax._src import pjit
from jax._src import sharding_impls
from jax._src.interpreters import ad
from jax._src.interpreters import batching
from jax._src.interpreters import mlir
from jax._src.interpreters import partial_eval as pe
from jax.sharding import PartitionSpec


def _params(fn: Any) -> tuple[str, ...]:
  """Parameter names of ``fn`` (empty where it has no Python signature)."""
  try:
    return tuple(inspect.signature(fn).parameters)
  except (TypeError, ValueError):
    return ()


# --- moved modules and primitives --------------------------------------------

# JAX's shard_map module: jax._src.shard_map where JAX has it (the home of
# jax.shard_map), else jax.experimental.shard_map (imported only there: where
# jax._src.shard_map exists, the experimental module is a deprecated alias).
JAX_SHARD_MAP_IN_CORE = importlib.util.find_spec("jax._src.shard_map") is not None
_jax_shard_map: Any = importlib.import_module(
    "jax._src.shard_map" if JAX_SHARD_MAP_IN_CORE else "jax.experimental.shard_map")


# Behaviours no attribute tells apart are asked of the code of JAX's shard_map module:
# the names a function reads and the message pieces it holds.
def _code_of(name: str) -> list[types.CodeType]:
  """The code of JAX's shard_map-module function ``name`` and of the functions nested
  in it (none where it has no such function)."""
  fn = getattr(_jax_shard_map, name, None)
  if fn is None or not hasattr(inspect.unwrap(fn), "__code__"):
    return []
  codes = [inspect.unwrap(fn).__code__]
  for code in codes:
    codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
  return codes


def _strings_of(name: str) -> list[str]:
  """The string constants (message pieces) in JAX's shard_map-module function ``name``."""
  return [k for code in _code_of(name) for k in code.co_consts if isinstance(k, str)]


def _refers_to(name: str, attribute: str) -> bool:
  """Whether JAX's shard_map-module function ``name`` reads the global or attribute
  ``attribute``."""
  return any(attribute in code.co_names for code in _code_of(name))


# The PRNG internals: jax._src.prng, or jax._src.random.prng where random is a package.
prng: Any = importlib.import_module(
    "jax._src.prng" if importlib.util.find_spec("jax._src.prng") is not None
    else "jax._src.random.prng")

# The jit primitive (``jit_p``; formerly ``pjit_p``).
jit_p: core.Primitive = getattr(pjit, "jit_p", None) or pjit.pjit_p  # type: ignore[attr-defined, unused-ignore]

jax_shard_map_p: core.Primitive = _jax_shard_map.shard_map_p
# The trace of JAX's eager shard_map bodies where ours may be bound (only the
# core shard_map's eager trace binds foreign shard_map-like primitives through it).
jax_eager_trace_type: type | None = (getattr(_jax_shard_map, "ShardMapTrace", None)
                                     if JAX_SHARD_MAP_IN_CORE else None)

# JAX's own debug-print primitive where it has one (else prints go through debug_callback).
debug_print_p: core.Primitive | None = getattr(debugging, "debug_print_p", None)
# The ref-creating primitives JAX's eager shard_map refuses (a ref made per device
# cannot leave the per-device program); none where it has no such rule.
EAGER_REFUSED_REF_PRIMITIVES: tuple[core.Primitive, ...] = tuple(
    p for p in (getattr(core, "ref_p", None), getattr(core, "empty_ref_p", None))
    if p is not None and p in getattr(_jax_shard_map, "eager_rules", {}))



def _eager_partial_sums_refusal() -> tuple[str | None, tuple[core.Primitive, ...]]:
  """Where JAX's eager shard_map refuses unreduced/reduced specs: its message (a string
  of its eager entry point) and the partial-sum casts whose eager rules raise it."""
  message = next((k for k in _strings_of("_shard_map_impl")
                  if k.startswith("Eager shard_map with unreduced")), None)
  if message is None:
    return None, ()
  rules = getattr(_jax_shard_map, "eager_rules", {})
  raising = {rule for rule in rules.values() if getattr(rule, "__name__", "") ==
             "raise_notimplemented"}
  return message, tuple(p for p, rule in rules.items() if rule in raising)


EAGER_PARTIAL_SUMS_REFUSAL, EAGER_REFUSED_SUM_PRIMITIVES = _eager_partial_sums_refusal()

# Primitives that exist on some releases only (absent ones are simply not listed).
mesh_cast_prims: tuple[core.Primitive, ...] = tuple(
    p for p in (getattr(pjit, "mesh_cast_p", None), getattr(pjit, "reshard_p", None))
    if p is not None)
# The jaxpr-form custom_vjp (only the untyped rewrite mode needs it).
custom_vjp_call_jaxpr_p: core.Primitive | None = getattr(cd, "custom_vjp_call_jaxpr_p", None)
custom_vjp_prims: tuple[core.Primitive, ...] = tuple(
    p for p in (getattr(cd, "custom_vjp_call_jaxpr_p", None),
                getattr(cd, "custom_vjp_call_p", None))
    if p is not None)

# --- JAX's shard_map equation --------------------------------------------------

# The params of JAX's staged shard_map equation, read off its lowering rule's
# keyword parameters (everything after the context and the operands), e.g.
# jaxpr, mesh, in_names, out_names, check_rep, rewrite, auto (experimental module);
# jaxpr, mesh, in_specs, out_specs, check_vma, manual_axes | newly_manual_axes (core).
EQN_PARAMS: tuple[str, ...] = _params(_jax_shard_map._shard_map_lowering)[2:]
# The equation names its manual axes: "auto" (the complement), "manual_axes" (all
# manual ones) or "newly_manual_axes" (only those not manual outside already).
MANUAL_PARAM: str = next(p for p in ("newly_manual_axes", "manual_axes", "auto")
                         if p in EQN_PARAMS)
# The equation's check flag ("check_vma" or "check_rep").
CHECK_PARAM: str = "check_vma" if "check_vma" in EQN_PARAMS else "check_rep"
# The equation's specs: PartitionSpecs ("in_specs") or per-dimension axis-name dicts.
EQN_HAS_SPECS = "in_specs" in EQN_PARAMS
# A separate ``rewrite`` param (the efficient-transpose flag; else it equals the check).
EQN_HAS_REWRITE = "rewrite" in EQN_PARAMS
# Only the newly manual axes count as the region's own (nested regions are partial).
COUNTS_NEWLY_MANUAL = MANUAL_PARAM == "newly_manual_axes"

# --- public API conventions ------------------------------------------------------

_PUBLIC_SHARD_MAP: Any = getattr(jax, "shard_map", None) or _jax_shard_map.shard_map
_PUBLIC_PARAMS = _params(_PUBLIC_SHARD_MAP)
# The check flag's public name, as error messages spell it.
CHECK_ARG = "check_vma" if "check_vma" in _PUBLIC_PARAMS else "check_rep"

# Avals carry a ManualAxisType (varying, unreduced, reduced axes); else just ``vma``.
AVALS_HAVE_MANUAL_AXIS_TYPE = hasattr(core, "ManualAxisType")


# What JAX's fully manual shard_map over Explicit axes does with an argument sharded
# otherwise than its in_spec, asked of its entry point's code: refuses it (its error
# suggests `jax.reshard`), reshards it (calls reshard), or neither (older ones).
INPUTS_MUST_MATCH_EXPLICIT_SPECS = any("If you want to reshard" in k
                                       for k in _strings_of("_shard_map"))
RESHARDS_EXPLICIT_INPUTS = _refers_to("_shard_map", "reshard")


def reshard_to_spec(x: Any, mesh: Any, spec: Any) -> Any:
  """``x`` resharded to ``spec`` over ``mesh``, unless its type already says so."""
  if core.typeof(x).sharding.spec == spec:
    return x
  return pjit.reshard(x, jax.sharding.NamedSharding(mesh, spec))  # type: ignore[attr-defined, unused-ignore]


def without_size_one_axes(spec: Any, mesh: Any) -> Any:
  """``spec`` as JAX types it: size-1 mesh axes dropped where its shard_map does so
  (``jax_remove_size_one_mesh_axis_from_type``, where JAX's shard_map reads it)."""
  drop = (getattr(_jax_shard_map, "remove_size_one_mesh_axis", None)
          or getattr(core, "remove_size_one_mesh_axis", None))
  if drop is not None and config.remove_size_one_mesh_axis_from_type.value:  # type: ignore[attr-defined, unused-ignore]
    return drop(spec, mesh)
  return spec


# A residual replicated along every axis: spec P() where equations carry
# PartitionSpecs, {0: ()} where they carry axis-name dicts.
RESIDUAL_SPEC_OMITS_UNSPLIT_DIM = EQN_HAS_SPECS
# Error messages in the core shard_map's vocabulary (axes "marked as manual", outputs
# "only varying across", `jax.shard_map`); else the experimental module's.
WORDING_CORE = JAX_SHARD_MAP_IN_CORE
# Divisibility errors name "the passed args" (else "args"): the wording of the core
# shard_maps that no longer carry the pmap-on-shard_map prototype (``_prepare_pmap``).
PASSED_ARGS_WORDING = JAX_SHARD_MAP_IN_CORE and not hasattr(_jax_shard_map, "_prepare_pmap")
# Spec entries naming axes outside the mesh are rejected up front (core shard_map).
SPECS_NAME_MESH_AXES_ONLY = JAX_SHARD_MAP_IN_CORE
# Partially manual shard_maps run eagerly where JAX's eager shard_map matches specs
# over the manual axes only (``_match_spec2``); else they need an enclosing jit.
EAGER_PARTIAL_AUTO = hasattr(_jax_shard_map, "_match_spec2")
# An eager partially manual result gets its out spec's sharding where JAX's result matcher
# is told no manual axes (``_match_spec`` without ``manual_axes``); where it is, the
# compiler places such a result (its spec then spelled in full, P('x', None)).
EAGER_PARTIAL_RESULT_BY_SPEC = "manual_axes" not in _params(_jax_shard_map._match_spec)


def _eager_trace_refuses_calls() -> bool:
  """Whether JAX's eager shard_map trace refuses call primitives (core.call,
  closed_call): asked of its ``process_call``, which then raises before looking at
  its arguments (one that runs the call fails on the empty ones instead)."""
  trace_type = getattr(_jax_shard_map, "ShardMapTrace", None)
  if trace_type is None:
    return True
  try:
    trace_type.process_call(None, None, None, (), {})
  except NotImplementedError:
    return True
  except Exception:  # noqa: BLE001  (it went on to run the call)
    return False
  return False


# Call primitives (core.call, closed_call) run inside an eager body (else refused).
EAGER_INLINES_CALLS = not _eager_trace_refuses_calls()
# out_specs may be a thunk (resolved once the body is traced) where JAX's shard_map
# still threads an out-specs thunk through its bind (``out_specs_thunk``/``out_names_thunk``).
OUT_SPECS_MAY_BE_THUNKS = bool({"out_specs_thunk", "out_names_thunk"}
                               & set(_params(_jax_shard_map._shard_map_staging)))
# in_specs=None reads as "no argument is mapped" where jax.shard_map's in_specs default
# is its ``Infer`` sentinel (where the default is None, None asks for inference, which
# is rejected off Explicit axes; the experimental module rejects None).
_IN_SPECS_PARAM = (inspect.signature(_PUBLIC_SHARD_MAP).parameters.get("in_specs")
                   if _PUBLIC_PARAMS else None)
IN_SPECS_NONE_MEANS_UNMAPPED = (JAX_SHARD_MAP_IN_CORE and _IN_SPECS_PARAM is not None
                                and _IN_SPECS_PARAM.default not in (None,
                                                                    inspect.Parameter.empty))
# JAX's transpose of a shard_map (where it threads an out-specs thunk) splits the body by
# partial evaluation, replays its known part, and returns instantiated zero cotangents
# for the residual (non-linear) inputs as outputs of the transposed equation; later ones
# run backward_pass over the whole body and return cotangents of linear inputs only.
TRANSPOSE_PARTIAL_EVALUATES = OUT_SPECS_MAY_BE_THUNKS


def _transpose_counts_cotangent_specs() -> bool:
  """Whether JAX's unchecked transpose finds the axes a cotangent is replicated along
  (to scale it by, and to psum an input's over) from the cotangent's specs, whose
  unreduced and reduced axes are the primal's swapped, rather than from the primal's."""
  counting = [c for c in _code_of("_shard_map_transpose") if "_unmentioned2" in c.co_names]
  return all("to_ct_spec" in c.co_names for c in counting)


TRANSPOSE_COUNTS_COTANGENT_SPECS = _transpose_counts_cotangent_specs()
# in_specs=None asks for inference from the arguments where None is jax.shard_map's
# in_specs default (before its ``Infer`` sentinel).
IN_SPECS_NONE_MEANS_INFER = (JAX_SHARD_MAP_IN_CORE and _IN_SPECS_PARAM is not None
                             and _IN_SPECS_PARAM.default is None)
# The body's results are named result[i] by flat position (where the staging rule
# no longer threads an out-specs thunk, i.e. traces the body from flat values).
BODY_RESULTS_BY_FLAT_INDEX = not OUT_SPECS_MAY_BE_THUNKS and JAX_SHARD_MAP_IN_CORE
# How JAX tells users to enter a mesh context: jax.set_mesh where JAX has it, else
# jax.sharding.use_mesh.
MESH_CONTEXT_API = "jax.set_mesh" if hasattr(jax, "set_mesh") else "jax.sharding.use_mesh"
# A mesh argument that differs from the context mesh (jax.set_mesh) is rejected.
CONTEXT_MESH_MUST_MATCH = JAX_SHARD_MAP_IN_CORE
# JAX's core shard_map checks its mesh and specs when the mapped function is called
# (the experimental one did when it was built).
CHECKS_ARGUMENTS_AT_CALL = JAX_SHARD_MAP_IN_CORE
# JAX's Infer: the in_specs default asking for inference.
INFER_SENTINEL: Any = getattr(_jax_shard_map, "Infer", object())

# --- PartitionSpecs ------------------------------------------------------------

def spec_entries(spec: Any) -> tuple:
  """A PartitionSpec's per-dimension entries (newer ones refuse ``*spec`` once they
  have unreduced/reduced axes and expose ``partitions``; older ones are tuples)."""
  entries = getattr(spec, "partitions", None)
  return tuple(spec) if entries is None else tuple(entries)


# --- unreduced/reduced axes (partial-sum types; absent on older releases) ------

NO_AXES: frozenset = frozenset()
# No partial sums: (unreduced, reduced) both empty.
NO_SUMS: tuple[frozenset, frozenset] = (NO_AXES, NO_AXES)
# PartitionSpecs carry unreduced/reduced axes.
SPECS_HAVE_PARTIAL_SUMS = hasattr(PartitionSpec(), "unreduced")


def _batched_specs_drop_partial_sums() -> bool:
  """Whether JAX's vmap of a shard_map drops a batched spec's unreduced/reduced axes
  (asked of ``pxla.batch_spec``, which builds the batched specs; newer ones refuse
  such specs, and vmap refuses such arguments before)."""
  from jax._src.interpreters import pxla
  if not SPECS_HAVE_PARTIAL_SUMS:
    return False
  try:
    batched = pxla.batch_spec(  # type: ignore[attr-defined, unused-ignore]
        PartitionSpec(None, reduced={"probe"}), 0, None)  # type: ignore[call-arg, unused-ignore]
  except ValueError:
    return False
  return not getattr(batched, "reduced", NO_AXES)


# vmap drops a batched argument's or result's partial sums from its spec (an input whose
# type has them then no longer matches its spec); else they are kept.
BATCHED_SPECS_DROP_PARTIAL_SUMS = _batched_specs_drop_partial_sums()


def spec_partial_sums(spec: Any) -> tuple[frozenset, frozenset]:
  """A PartitionSpec's (unreduced, reduced) axes (always empty where it has none)."""
  return (frozenset(getattr(spec, "unreduced", NO_AXES)),
          frozenset(getattr(spec, "reduced", NO_AXES)))


def with_spec_partial_sums(spec: Any, unreduced: frozenset, reduced: frozenset) -> Any:
  """``spec`` with its unreduced/reduced axes replaced."""
  if spec_partial_sums(spec) == (unreduced, reduced):
    return spec
  assert SPECS_HAVE_PARTIAL_SUMS, "this jax's PartitionSpecs have no unreduced/reduced axes"
  return spec.update(unreduced=unreduced, reduced=reduced)


# JAX's check of unreduced/reduced specs reads both kinds (older ones, whose messages
# say "unreduced", read only unreduced axes).
SPEC_CHECK_READS_REDUCED = _refers_to("_check_unreduced", "reduced")

# Where avals have no ManualAxisType but JAX's shard_map types its body values' partial
# sums (checking in_specs against them), those are their sharding spec's unreduced/reduced
# axes, manual or not. Before that, a body does not type them: an unreduced input just
# varies along its unreduced axes there, and out_specs alone make a result's.
_SUMS_IN_SHARDING = (SPECS_HAVE_PARTIAL_SUMS and not AVALS_HAVE_MANUAL_AXIS_TYPE and any(
    "present on the in_aval" in k for k in _strings_of("_shard_shaped_array")))
BODY_TYPES_PARTIAL_SUMS = AVALS_HAVE_MANUAL_AXIS_TYPE or _SUMS_IN_SHARDING


def partial_sums_of(aval: Any) -> tuple[frozenset, frozenset]:
  """A per-device value's (unreduced, reduced) axes: its ManualAxisType's manual ones,
  else those its sharding spec carries."""
  mat = getattr(aval, "mat", None)
  if mat is not None:
    return frozenset(mat.unreduced), frozenset(mat.reduced)
  sharding = getattr(aval, "sharding", None)
  if _SUMS_IN_SHARDING and sharding is not None:
    return spec_partial_sums(sharding.spec)
  return NO_AXES, NO_AXES


def unreplicated_sums_of(aval: Any) -> tuple[frozenset, frozenset]:
  """The partial-sum axes that count against a value's replication: its manual ones
  where avals type them; none where they sit in its sharding (JAX's check of outputs
  reads only the varying axes there, and the out_specs check names the partial sums)."""
  return NO_SUMS if _SUMS_IN_SHARDING else partial_sums_of(aval)


def cast_to_unreduced(x: Any, axes: tuple) -> Any:
  """Mark ``x`` (varying over ``axes``) as an unreduced partial sum over them."""
  from jax._src.lax import parallel as lax_parallel
  return lax_parallel.vary_unreduced_cast(x, axes)  # type: ignore[attr-defined, unused-ignore]  # newer JAX only


def implicit_casts() -> bool:
  """Whether shard_map casts outputs to what out_specs declare (``jax_auto_pcast``
  where JAX has that flag; always otherwise)."""
  flag = getattr(config, "auto_pcast", None)
  return True if flag is None else bool(flag.value)


# Cotangent types differ from tangent types (unreduced and reduced axes swap).
_HAS_CT_AVALS = hasattr(core.ShapedArray, "to_ct_aval")


def cotangent_aval(aval: Any) -> Any:
  """The aval of a cotangent of a value typed ``aval`` (where JAX types cotangents
  apart, a reduced value's cotangent is an unreduced partial sum)."""
  return aval.to_ct_aval() if _HAS_CT_AVALS else aval.to_tangent_aval()


# backward_pass checks accumulated cotangents against the accumulator's own aval
# (``ad.ct_check(accum, ct)``: an UndefinedPrimal then holds the cotangent type), not
# against the primal's ``to_ct_aval()`` (``ct_check(primal, ct)``).
_UNDEFINED_PRIMAL_HOLDS_CT = _HAS_CT_AVALS and _params(getattr(ad, "ct_check", None))[:1] == (
    "accum",)


def undefined_primal_aval(aval: Any) -> Any:
  """What ``ad.UndefinedPrimal`` holds for an input typed ``aval`` (its cotangent's
  type where backward_pass checks cotangents against it, else the primal type)."""
  return aval.to_ct_aval() if _UNDEFINED_PRIMAL_HOLDS_CT else aval


def zero_cotangent_aval(undefined: Any) -> Any:
  """The aval of a zero cotangent for the input ``ad.UndefinedPrimal`` ``undefined``."""
  aval = undefined.aval
  return aval.to_tangent_aval() if _UNDEFINED_PRIMAL_HOLDS_CT else cotangent_aval(aval)


def psum_invariant(args: Sequence[Any], axes: tuple) -> list:
  """``psum_invariant`` of each of ``args`` over ``axes``: one multi-operand bind taking
  ``axis_index_groups`` where JAX's primitive has multiple results, else one bind per
  operand with ``axes`` alone (newer JAX; its abstract eval takes no groups)."""
  from jax._src.lax import parallel as lax_parallel
  prim = lax_parallel.psum_invariant_p
  if prim.multiple_results:
    return list(prim.bind(*args, axes=axes, axis_index_groups=None))
  return [prim.bind(x, axes=axes) for x in args]


# --- the replication / varying-manual-axes check flag ------------------------

# JAX's internal flag making collectives track varying axes: _check_vma or _check_rep.
_CHECK_FLAG: Any = (config._check_vma if hasattr(config, "_check_vma")  # type: ignore[attr-defined, unused-ignore]
                    else config._check_rep)  # type: ignore[attr-defined, unused-ignore]


def check_flag(check: bool) -> contextlib.AbstractContextManager:
  """JAX's internal flag making collectives track varying axes (check_rep/check_vma)."""
  return _CHECK_FLAG(check)


def check_flag_value() -> bool:
  return bool(_CHECK_FLAG.value)


def varying_axes_typed() -> bool:
  """Whether checked bodies type values with varying manual axes.

  Optional where JAX has ``jax_varying_axes_in_types``, always so otherwise.
  """
  flag = getattr(config, "varying_axes_in_types", None)
  return True if flag is None else bool(flag.value)


# --- avals --------------------------------------------------------------------

# JAX's shard_aval handler convention: (mesh, manual_axes, check_vma, spec, aval), or
# (mesh, auto, check_rep, names, aval) in the experimental module's.
_SHARD_HANDLER_TAKES_SPEC = "spec" in _params(core.shard_aval_handlers[core.ShapedArray])
# A value entering a nested shard_map keeps varying over the enclosing body's axes
# (the spec-taking handlers add the aval's own vma); else typed by in_specs alone.
SHARD_KEEPS_OUTER_VMA = _SHARD_HANDLER_TAKES_SPEC


def vma_of(aval: Any) -> frozenset:
  """The manual axes a per-device value may vary along (empty if untyped)."""
  mat = getattr(aval, "mat", None)
  if mat is not None:
    return frozenset(mat.varying)
  return frozenset(getattr(aval, "vma", frozenset()))


def with_manual_type(aval: core.ShapedArray, vma: frozenset,
                     partial_sums: tuple[frozenset, frozenset], **updates: Any
                     ) -> core.ShapedArray:
  """``aval.update(**updates)`` with its varying manual axes set to ``vma`` and its
  (unreduced, reduced) axes to ``partial_sums`` (where avals type them)."""
  if AVALS_HAVE_MANUAL_AXIS_TYPE:
    unreduced, reduced = partial_sums
    mat = core.ManualAxisType(varying=frozenset(vma), unreduced=unreduced,  # type: ignore[attr-defined, unused-ignore]  # newer JAX only
                              reduced=reduced)
    return aval.update(manual_axis_type=mat, **updates)
  if any(partial_sums) and not _SUMS_IN_SHARDING:
    # Untyped: an unreduced body value varies along those axes (a reduced one is equal).
    return aval.update(vma=frozenset(vma) | partial_sums[0], **updates)
  if any(partial_sums):
    sharding = updates.pop("sharding", aval.sharding)
    unreduced, reduced = spec_partial_sums(sharding.spec)
    updates["sharding"] = sharding.update(spec=with_spec_partial_sums(
        sharding.spec, unreduced | partial_sums[0], reduced | partial_sums[1]))
  return aval.update(vma=frozenset(vma), **updates)


def call_shard_handler(handler: Callable, mesh: Any, auto: frozenset, check: bool,
                       names: Any, spec: Any, aval: Any) -> Any:
  """A ``core.shard_aval_handlers`` entry (e.g. refs), in JAX's convention.

  ``(mesh, auto, check_rep, names, aval)`` or ``(mesh, manual_axes, check_vma, spec, aval)``.
  """
  if _SHARD_HANDLER_TAKES_SPEC:
    manual = frozenset(a for a in mesh.axis_names if a not in auto)
    return handler(mesh, manual, check, spec, aval)
  return handler(mesh, auto, check, names, aval)


def call_unshard_handler(handler: Callable, mesh: Any, check: bool, names: Any, spec: Any,
                         aval: Any) -> Any:
  """A ``core.unshard_aval_handlers`` entry: names or spec, as the shard handlers."""
  return handler(mesh, check, spec if _SHARD_HANDLER_TAKES_SPEC else names, aval)


def vmapped_mesh_axes() -> frozenset:
  """Mesh axes an enclosing vmap maps over explicitly (none where JAX has no such vmap)."""
  env = core.get_axis_env()
  return frozenset(getattr(env, "explicit_mesh_axis_names", ()))


# ``core.get_aval`` where JAX still has it, else its successor ``core.typeof``.
_GET_AVAL: Callable[[Any], core.AbstractValue] = getattr(core, "get_aval", None) or core.typeof


def get_aval(x: Any) -> core.AbstractValue:
  return _GET_AVAL(x)


# --- binding a primitive whose first operand is a function -------------------

def eager_default_mesh() -> Any:
  """The concrete mesh an eager shard_map on an AbstractMesh starts from, or None.

  The core shard_map takes the context mesh of ``jax.set_mesh`` (arguments' meshes
  still win); the experimental one: none, the arguments must name it.
  """
  if not JAX_SHARD_MAP_IN_CORE:
    return None
  from jax._src import mesh as mesh_lib
  found = mesh_lib.get_concrete_mesh()
  return None if found is None or found.empty else found


def split_bind(args: Sequence[Any], params: dict[str, Any]) -> tuple[Any, list, dict]:
  """(body, operands, params) of a ``bind`` call in either convention: the body as the
  first operand, or as ``subfuns=(body,)`` (newer jaxpr interpreters)."""
  if "subfuns" in params:
    params = dict(params)
    body, = params.pop("subfuns")
    return body, list(args), params
  return args[0], list(args[1:]), params


# Primitive.get_bind_params returns the params (with ``subfuns``) or (subfuns, params).
_BIND_PARAMS_CARRY_SUBFUNS = isinstance(core.Primitive("probe").get_bind_params({}), dict)


def bind_params_of(body: Any, bind_params: dict[str, Any]) -> Any:
  """What ``Primitive.get_bind_params`` returns for ``body`` and ``bind_params``."""
  if _BIND_PARAMS_CARRY_SUBFUNS:
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
  traced: Any = pe.trace_to_jaxpr_dynamic(fun, list(in_avals))
  if len(traced) == 4:  # older JAX also returns the jax attrs the body mutated
    jaxpr, out_avals, consts, attrs = traced
    if attrs:
      raise NotImplementedError("shard_map bodies may not mutate jax attrs")
    return jaxpr, out_avals, consts
  jaxpr, out_avals, consts = traced
  return jaxpr, out_avals, consts


# JAX's tracing entry point for functions of flat trees (pe.trace_to_jaxpr, a cache
# without a signature to read), which its own shard_map stages bodies through (and its
# tracing-cache accounting counts) where that staging rule takes a plain callable and
# its debug info.
_TRACES_FLAT_TREES = (hasattr(pe, "trace_to_jaxpr") and "debug_info" in _params(
    getattr(_jax_shard_map, "_shard_map_staging", None)))


def trace_body_to_jaxpr(fun: Any, in_avals: Sequence[core.AbstractValue]
                        ) -> tuple[core.Jaxpr, list, list]:
  """``trace_to_jaxpr`` for a shard_map body: through JAX's tracing entry point where
  it has one, as a traced body of JAX's own shard_map is."""
  if not _TRACES_FLAT_TREES:
    return trace_to_jaxpr(fun, in_avals)
  from jax._src.tree_util import FlatTree  # type: ignore[attr-defined, unused-ignore]  # newer JAX only

  def flat(*args: Any) -> Any:  # a fresh key: the entry point's cache never hits
    return FlatTree.flatten(list(fun.call_wrapped(*args)))
  closed, _ = pe.trace_to_jaxpr(  # type: ignore[attr-defined, unused-ignore]  # newer JAX only
      flat, FlatTree.flatten((tuple(in_avals), {})), fun.debug_info,
      fun_returns_flat_tree=True)
  # The entry point names results by position; ours come from the body's own paths.
  jaxpr = closed.jaxpr.replace(debug_info=fun.debug_info)
  return jaxpr, [v.aval for v in jaxpr.outvars], list(closed.consts)


_TRACER_TAKES_SOURCE_INFO = "source_info" in _params(pe.DynamicJaxprTrace.to_jaxpr_tracer)
_canonicalize_value: Callable[[Any], Any] | None = getattr(dtypes, "canonicalize_value", None)


def to_jaxpr_tracer(trace: pe.DynamicJaxprTrace, x: Any, source_info: Any) -> Any:
  if _TRACER_TAKES_SOURCE_INFO:
    if _canonicalize_value is not None and not isinstance(x, core.Tracer):
      x = _canonicalize_value(x)  # stage only canonical constants (no raw numpy arrays)
    return trace.to_jaxpr_tracer(x, source_info)  # type: ignore[call-arg, unused-ignore]
  return trace.to_jaxpr_tracer(x)  # type: ignore[call-arg, unused-ignore]


_HAS_EMIT_EQN = hasattr(pe.DynamicJaxprTrace, "emit_eqn")


def emit_eqn(trace: pe.DynamicJaxprTrace, in_tracers: Sequence[Any],
             out_avals: Sequence[core.AbstractValue], prim: core.Primitive,
             params: dict[str, Any], effects: Any, source_info: Any) -> list:
  """Add one equation to ``trace``'s jaxpr; returns its output tracers."""
  if _HAS_EMIT_EQN:
    return trace.emit_eqn(list(in_tracers), list(out_avals), prim, params,  # type: ignore[attr-defined, unused-ignore]
                          effects, source_info)
  outs = [pe.DynamicJaxprTracer(trace, a, source_info) for a in out_avals]
  eqn = pe.new_jaxpr_eqn([trace.getvar(t) for t in in_tracers],  # type: ignore[attr-defined, unused-ignore]
                         [trace.makevar(t) for t in outs], prim, params,  # type: ignore[attr-defined, unused-ignore]
                         effects, source_info)
  trace.frame.add_eqn(eqn)  # type: ignore[arg-type, unused-ignore]
  return outs


# Effects keyed by a body's input positions (core.positional_effects / eqn_effects).
_POSITIONAL_EFFECTS = hasattr(core, "positional_effects")


def body_effects(jaxpr: core.Jaxpr, axis_names: Sequence[Any]) -> Any:
  """The effects a shard_map equation with this body has outside."""
  effects = core.positional_effects(jaxpr) if _POSITIONAL_EFFECTS else jaxpr.effects  # type: ignore[attr-defined, unused-ignore]
  return core.filter_named_axis_effects(effects, axis_names)


@contextlib.contextmanager
def no_context() -> Iterator[None]:
  yield


# --- lowering -------------------------------------------------------------------

_SUBCOMP_PARAMS = _params(mlir.jaxpr_subcomp)
_CALL_LOWERING_PARAMS = _params(mlir.call_lowering)
# Lowering threads jaxpr constants (``const_lowering``): a Shardy manual computation
# then takes the dimension variables, effect tokens and hoisted jaxpr constants as
# leading region arguments; else the region sees dimension variables from outside
# and threads no tokens.
SHARDY_REGION_THREADS_STATE = "const_lowering" in _SUBCOMP_PARAMS


def ir_type(module_ctx: Any, aval: core.AbstractValue) -> Any:
  if "ctx" in _params(mlir.aval_to_ir_type):
    return mlir.aval_to_ir_type(module_ctx, aval)  # type: ignore[call-arg, unused-ignore]
  return mlir.aval_to_ir_type(aval)  # type: ignore[call-arg, arg-type, unused-ignore]


def jaxpr_constants(jaxpr: core.Jaxpr) -> list[tuple[Any, core.AbstractValue]]:
  """Large constants held in the jaxpr's literals, lowered as arguments (where
  lowering threads constants)."""
  if not SHARDY_REGION_THREADS_STATE:
    return []
  return list(core.jaxpr_const_args(jaxpr))  # type: ignore[attr-defined, unused-ignore]


def lower_inline(ctx: Any, module_ctx: Any, jaxpr: core.Jaxpr, tokens: Any,
                 args: Sequence[Any], *, dim_var_values: Sequence[Any],
                 const_lowering: dict | None = None) -> tuple[Sequence[Any], Any]:
  """``jaxpr`` lowered in place (inside the current insertion point)."""
  extra: dict[str, Any] = {}
  if "const_lowering" in _SUBCOMP_PARAMS:
    extra["const_lowering"] = ctx.const_lowering if const_lowering is None else const_lowering
  if "outer_traceback" in _SUBCOMP_PARAMS:
    extra["outer_traceback"] = None
  subcomp: Any = mlir.jaxpr_subcomp  # its keywords differ per release
  return subcomp(module_ctx, jaxpr, ctx.name_stack, tokens, (), *args,
                 dim_var_values=dim_var_values, **extra)


def lower_call(ctx: Any, name: str, jaxpr: core.Jaxpr, module_ctx: Any,
               avals_in: Sequence[Any], avals_out: Sequence[Any], args: Sequence[Any],
               arg_names: Sequence[str], result_names: Sequence[str]) -> tuple[Any, Any]:
  """``jaxpr`` lowered as a called function ``name``; (outputs, tokens out)."""
  # Closed here, not by pe.close_jaxpr (which older call_lowerings apply to a bare
  # Jaxpr): that cache is keyed weakly on the jaxpr but its value holds the jaxpr, so
  # every body ever lowered would stay alive until evicted (~27 KB per fresh pmap).
  closed = core.ClosedJaxpr(jaxpr, ())
  call: Any = mlir.call_lowering  # its parameters differ per release
  extra: dict[str, Any] = {}
  if "const_lowering" in _CALL_LOWERING_PARAMS:
    extra["const_lowering"] = ctx.const_lowering
  lead = (name, ctx.name_stack) if "name_stack" in _CALL_LOWERING_PARAMS else (name,)
  return call(*lead, closed, None, module_ctx, avals_in, avals_out, ctx.tokens_in,
              *args, dim_var_values=ctx.dim_var_values, arg_names=list(arg_names),
              result_names=list(result_names), **extra)


_SDY_LIST: Any = (getattr(sharding_impls, "SdyArrayList", None)
                  or sharding_impls.SdyArrayShardingList)  # type: ignore[attr-defined, unused-ignore]
_SDY_LIST_BUILD_TAKES_CACHE = "cache" in _params(_SDY_LIST.build)


def build_sdy_shardings(module_ctx: Any, shardings: Sequence[Any]) -> Any:
  """The attribute listing one Shardy sharding per operand/result."""
  listed = _SDY_LIST(tuple(shardings) if _SDY_LIST_BUILD_TAKES_CACHE else list(shardings))
  if _SDY_LIST_BUILD_TAKES_CACHE:
    return listed.build(module_ctx.sharding_attr_cache)
  return listed.build()


# NamedSharding marks axes manual outside by a private argument (older) or through
# its abstract mesh's axis types.
_NAMED_SHARDING_MANUAL_AXES_ARG = hasattr(jax.sharding.NamedSharding, "_manual_axes")


def region_sharding(mesh: Any, spec: Any, outer_manual: frozenset) -> Any:
  """The NamedSharding of a region operand, axes manual outside marked so."""
  from jax.sharding import NamedSharding
  if not _NAMED_SHARDING_MANUAL_AXES_ARG:
    from jax._src.mesh import AxisType
    abstract = mesh.abstract_mesh
    if outer_manual:
      abstract = abstract.update_axis_types({a: AxisType.Manual for a in outer_manual})
    return NamedSharding(abstract, spec)
  return NamedSharding(mesh, spec, _manual_axes=outer_manual)  # type: ignore[call-arg, unused-ignore]


def gspmd_conversion_axes(manual: frozenset, newly_manual: Sequence[Any]) -> Any:
  """The axes whose total size decides whether GSPMD converts to/from manual: those
  the equation names (newly manual ones, or every manual axis of the region)."""
  return newly_manual if COUNTS_NEWLY_MANUAL else manual


def region_is_partial(mesh: Any, auto: frozenset, newly_manual: frozenset, *,
                      shardy: bool) -> bool:
  """Whether a region leaves array dimensions open to the compiler.

  Where the shard_map has auto axes, in the experimental module (equations naming
  ``auto``) and in GSPMD regions of equations naming all their ``manual_axes``;
  otherwise (Shardy there, everything where equations name ``newly_manual_axes``)
  wherever the region itself makes fewer than all mesh axes manual (also nested in
  another).
  """
  if MANUAL_PARAM == "auto" or (MANUAL_PARAM == "manual_axes" and not shardy):
    return bool(auto)
  return len(newly_manual) < len(mesh.axis_names)


_SDY_OPEN_WRT_AXIS_TYPES = "modify_wrt_axis_types" in _params(
    jax.sharding.NamedSharding._to_sdy_sharding)


def sdy_region_sharding(sharding: Any, ndim: int, partially_manual: bool) -> Any:
  """Shardy sharding of a region operand; auto axes may shard open dimensions.

  Newer JAX opens them itself (``modify_wrt_axis_types``); where the sharding lists
  ``dim_shardings``, JAX's shard_map opens every dimension of a partially manual
  region, where it lists ``dimension_shardings`` only those not sharded already.
  """
  if _SDY_OPEN_WRT_AXIS_TYPES:
    return sharding._to_sdy_sharding(ndim, modify_wrt_axis_types=partially_manual)
  result = sharding._to_sdy_sharding(ndim)
  if partially_manual:
    dims = getattr(result, "dim_shardings", None)
    open_all = dims is not None
    for dim in (result.dimension_shardings if dims is None else dims):
      if open_all or not dim.axes:
        dim.is_open = True  # let the compiler shard auto axes here
  return result


# --- transformation rules (autodiff, partial eval, DCE, discharge, vmap) ------

# JAX's LinearizeTrace knows whether it feeds a VJP (threaded into linearize_subtrace).
_LINEARIZE_THREADS_IS_VJP = "is_vjp" in _params(ad.LinearizeTrace.__init__)


def linearize_subtrace(fun: Any, trace: Any, nonzero_in: Sequence[bool],
                       debug_info: core.DebugInfo) -> tuple[Any, Callable]:
  """JAX's per-body linearization of ``fun`` under ``trace``: (primal fun, aux thunk).

  The primal fun returns the non-forwarded residuals, then the primal outputs;
  aux is ``(res_avals, nonzero_out, lin_jaxpr, env, in_fwd, out_fwd)``.
  """
  linearize: Any = ad.linearize_subtrace  # its parameters differ per release
  if _LINEARIZE_THREADS_IS_VJP:
    return linearize(fun, trace.is_vjp, trace.tag, nonzero_in, debug_info)
  return linearize(fun, trace.tag, nonzero_in, debug_info)


_RECIPE_TAKES_TRACE = "trace" in _params(pe.new_eqn_recipe)


def new_eqn_recipe(trace: pe.JaxprTrace, in_tracers: Sequence[Any], out_tracers: Sequence[Any],
                   prim: core.Primitive, params: dict[str, Any], effects: Any,
                   source_info: Any) -> Any:
  """A partial-eval equation recipe (newer ones also take the trace)."""
  make: Any = pe.new_eqn_recipe  # its signature differs per release
  if _RECIPE_TAKES_TRACE:
    return make(trace, in_tracers, out_tracers, prim, params, effects, source_info)
  return make(in_tracers, out_tracers, prim, params, effects, source_info)


def eqn_effects(jaxpr: core.Jaxpr, invars: Sequence[Any], axis_names: Sequence[Any]) -> Any:
  """Effects of an equation applying body ``jaxpr`` to ``invars`` (for ``new_jaxpr_eqn``).

  Input effects keyed by the body's positions are resolved to the equation's operands
  where JAX keys them so; else the body's effects are used as they are.
  """
  effects = core.eqn_effects(jaxpr, invars) if _POSITIONAL_EFFECTS else jaxpr.effects  # type: ignore[attr-defined, unused-ignore]
  return core.filter_named_axis_effects(effects, axis_names)


def discharge_state(jaxpr: core.Jaxpr) -> tuple[core.Jaxpr, list]:
  """``jaxpr`` with its ref inputs discharged: (pure jaxpr, its constants)."""
  from jax._src.state import discharge
  discharge_fn: Any = discharge.discharge_state  # its signature differs per release
  if "closed_jaxpr" in _params(discharge_fn):
    closed = discharge_fn(core.ClosedJaxpr(jaxpr, ()))
    return closed.jaxpr, list(closed.consts)
  body, consts = discharge_fn(jaxpr, ())
  return body, list(consts)


def ragged_batch_dims() -> tuple[type, ...]:
  """Batch-dimension types for ragged vmap (where JAX still has them)."""
  ragged = getattr(batching, "RaggedAxis", None)
  return () if ragged is None else (ragged,)


# vmap over Explicit mesh axes hides them from the body (core.remove_explicit_mesh_axis_names);
# where JAX cannot, its shard_map ignores them.
_VMAP_HIDES_EXPLICIT_AXES = hasattr(core, "remove_explicit_mesh_axis_names")
# JAX's axis environment tracks the mesh axes a vmap spent (explicit_mesh_axis_names):
# shard_map's errors then name the mesh's axes without them (as a set).
VMAPPED_AXES_LEAVE_MESH = hasattr(core.get_axis_env(), "explicit_mesh_axis_names")


# JAX's vmap of a shard_map reads the Explicit mesh axes a vmap maps over (its specs may
# not name them); the experimental one ignores them.
_BATCH_READS_EXPLICIT_AXES = _refers_to("_shard_map_batch", "explicit_mesh_axis")
# ... and splits the batch dimension over them as over spmd_axis_name (the releases whose
# batching shares one helper for both); later ones leave the batch dimension unsplit.
EXPLICIT_VMAP_AXES_SPLIT_BATCH = (_BATCH_READS_EXPLICIT_AXES
                                  and hasattr(_jax_shard_map, "_modify_specs_axis_data"))


def explicit_vmap_axes(axis_data: Any) -> tuple | None:
  """Explicit mesh axes a vmap maps over (None where JAX's shard_map ignores them)."""
  return axis_data.explicit_mesh_axis if _BATCH_READS_EXPLICIT_AXES else None


def without_explicit_mesh_axes(axes: tuple | None) -> contextlib.AbstractContextManager:
  """Context hiding the vmapped-away explicit mesh ``axes``."""
  if _VMAP_HIDES_EXPLICIT_AXES and axes:
    return core.remove_explicit_mesh_axis_names(axes)  # type: ignore[attr-defined, unused-ignore]
  return no_context()


# Derived bodies may leave their argument names and result paths unknown.
_HAS_UNKNOWN_NAMES = hasattr(lu.WrappedFun, "with_unknown_names")


def name_derived_body(fun: Any, rename: Callable[[Any], Any]) -> Any:
  """A body derived from a user's (jvp, linearize, partial eval, transpose half).

  Older shard_maps trace it under names derived from the user's (``rename``); newer
  ones leave its argument names and result paths unknown, which tracing errors then
  report as such.
  """
  return fun.with_unknown_names() if _HAS_UNKNOWN_NAMES else rename(fun)


# ad.backward_pass evaluates a jaxpr's non-linear equations itself (its accumulator
# form, whose cotangent argument is ``cts_in``); else the linear part must be split
# off (partial evaluation) first.
BACKWARD_PASS_EVALUATES_NONLINEAR = "cts_in" in _params(ad.backward_pass)
