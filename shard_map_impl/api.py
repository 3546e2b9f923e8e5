"""Public entry point: ``shard_map`` in jax 0.10's and jax 0.6's call forms.

Validates arguments, flattens pytrees, matches specs to arguments (tree
prefixes, ``None`` for unsharded arguments), and binds ``shard_map_p`` on the
flattened body (``binding``).  Output specs are resolved lazily (after the body is traced),
which is also what allows ``out_specs`` to be a thunk.
"""
from __future__ import annotations

import functools
from typing import Any
from collections.abc import Callable, Hashable, Sequence, Set

from jax._src import api_util
from jax._src import core
from jax._src import linear_util as lu
from jax._src import traceback_util
from jax._src.mesh import get_abstract_mesh
from jax._src.tree_util import broadcast_prefix, prefix_errors
from jax.tree_util import PyTreeDef, tree_flatten, tree_unflatten

from shard_map_impl import debug_names, errors
from shard_map_impl.binding import bind_body
from shard_map_impl.jax_line import (CHECKS_ARGUMENTS_AT_CALL, CONTEXT_MESH_MUST_MATCH,
                                     IN_SPECS_NONE_MEANS_INFER, IN_SPECS_NONE_MEANS_UNMAPPED,
                                     INFER_SENTINEL, MESH_CONTEXT_API, OUT_SPECS_MAY_BE_THUNKS,
                                     RESHARDS_EXPLICIT_INPUTS, reshard_to_spec, vmapped_mesh_axes)
from shard_map_impl.specs import (AnyMesh, AxisNames, Specs, canonicalize_spec,
                                 divisibility_failures, inferred_spec, rank_failures,
                                 spec_leaf_problems, specs_are_valid)

traceback_util.register_exclusion(__file__)


def _validate_specs(kind: str, mesh: AnyMesh, specs: Specs, auto: frozenset,
                    manual: frozenset | None = None) -> None:
  if kind == "in" and specs is None:
    if IN_SPECS_NONE_MEANS_UNMAPPED:
      return
    raise errors.in_specs_none()
  if not specs_are_valid(mesh, specs, auto):
    raise errors.bad_spec_leaves(kind, mesh, *spec_leaf_problems(mesh, specs, auto), auto,
                                 manual)
  errors.check_partial_sum_specs(kind, mesh, manual or errors.manual_names(mesh, auto), specs)


class _OutNames:
  """Memoised thunk: flat out_specs (canonical) once the output tree is known."""

  def __init__(self, mesh: AnyMesh, out_specs: Specs | Callable[[], Specs], out_tree: Callable,
               auto: frozenset):
    self._mesh, self._specs, self._out_tree, self._auto = mesh, out_specs, out_tree, auto
    self._value: tuple[AxisNames, ...] | None = None
    self.resolved_specs: Specs = None

  def __call__(self) -> tuple[AxisNames, ...]:
    if self._value is None:
      specs = self._specs() if callable(self._specs) else self._specs
      if callable(self._specs):
        _validate_specs("out", self._mesh, specs, self._auto)
      tree = self._out_tree()
      placeholder = tree_unflatten(tree, [object()] * tree.num_leaves)
      try:
        flat = broadcast_prefix(specs, placeholder)
      except ValueError:
        err, *_ = prefix_errors(specs, placeholder)
        raise err("shard_map out_specs") from None
      self.resolved_specs = specs
      self._value = tuple(canonicalize_spec(s) for s in flat)
    return self._value


class _Infer:
  """Default ``in_specs``: infer them from the arguments' (Explicit) shardings."""

  def __repr__(self) -> str:
    return "jax.sharding.Infer"


Infer = _Infer()
_UNSET: Any = object()
_LEGACY_POSITIONAL = ("mesh", "in_specs", "out_specs", "check_rep", "auto")


def infers(in_specs: Any) -> bool:
  """Whether ``in_specs`` asks for inference from the arguments (``Infer``)."""
  return (in_specs is Infer or in_specs is INFER_SENTINEL
          or (in_specs is None and IN_SPECS_NONE_MEANS_INFER))


@traceback_util.api_boundary
def shard_map(f: Callable | None = None, /, *positional: Any, mesh: AnyMesh | None = _UNSET,
              in_specs: Specs = _UNSET, out_specs: Specs | Callable[[], Specs] = _UNSET,
              axis_names: Set[Hashable] = _UNSET, check_vma: bool | None = None,
              check_rep: bool | None = None, auto: Set[Hashable] | None = None,
              debug_info: core.DebugInfo | None = None) -> Any:
  """Map ``f`` over shards of its arguments, as ``jax.shard_map``.

  Both call forms are accepted on both JAX lines:

  * jax 0.10's ``shard_map(f, /, *, out_specs, in_specs=Infer, mesh=None,
    axis_names=frozenset(), check_vma=True)``, also as a decorator factory
    ``shard_map(out_specs=..., mesh=...)(f)``; ``mesh=None`` takes the context
    mesh (``jax.set_mesh`` / ``jax.sharding.use_mesh``), ``axis_names`` the
    manual axes (others are left to the compiler), omitted ``in_specs`` are
    inferred from Explicit-axis argument shardings;
  * jax 0.6's ``jax.experimental.shard_map.shard_map(f, mesh, in_specs,
    out_specs, check_rep=True, auto=frozenset())``.

  Args:
    f: the per-device function.
    mesh: a ``jax.sharding.Mesh`` or ``AbstractMesh``; its axis names may be
      used by collectives inside ``f``.
    in_specs: pytree prefix of the argument tuple with ``PartitionSpec``
      leaves (``None`` for an argument passed unsharded as a constant).
    out_specs: pytree prefix of ``f``'s output with ``PartitionSpec`` leaves
      (or a thunk returning one); unmentioned mesh axes promise replication.
    axis_names: the mesh axes ``f`` is manual over (default: all).
    check_vma / check_rep: verify the replication promise statically (and
      enable the efficient transpose); two names for one flag.
    auto: mesh axes left to the compiler (the complement of ``axis_names``).
    debug_info: how tracing errors and jaxprs describe ``f`` and its arguments
      (``api_util.debug_info(...)`` for ``f`` applied to the arguments the mapped
      function is called with, one name per flattened argument). For an API built on
      shard_map that wants its own name in errors ("... for pmap"). Default: built
      per call as ``api_util.debug_info("shard_map", f, args, {})``.

  Returns:
    The mapped function, taking global arrays and returning global arrays.
  """
  given: dict[str, Any] = dict(mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=check_rep,
               auto=auto)
  if len(positional) > len(_LEGACY_POSITIONAL):
    raise TypeError(f"shard_map takes at most {1 + len(_LEGACY_POSITIONAL)} positional "
                    f"arguments (f, {', '.join(_LEGACY_POSITIONAL)}) but got "
                    f"{1 + len(positional)}")
  for name, value in zip(_LEGACY_POSITIONAL, positional, strict=False):  # a prefix
    if given[name] is not _UNSET and given[name] is not None:
      raise TypeError(f"shard_map got multiple values for argument '{name}'")
    given[name] = value
  if given["out_specs"] is _UNSET:
    raise TypeError("shard_map() missing required keyword argument: 'out_specs'")
  if callable(given["out_specs"]) and not OUT_SPECS_MAY_BE_THUNKS:
    raise errors.bad_spec_leaves("out", None, [((), given["out_specs"])], [], frozenset())
  if check_vma is not None and given["check_rep"] is not None:
    raise TypeError("shard_map takes check_vma (jax.shard_map) or check_rep "
                    "(jax.experimental.shard_map), not both")
  if axis_names is not _UNSET and given["auto"] is not None:
    raise TypeError("shard_map takes axis_names (the manual axes) or auto (the "
                    "axes left to the compiler), not both")
  check = check_vma if check_vma is not None else given["check_rep"]
  spec = _Request(
      mesh=None if given["mesh"] is _UNSET else given["mesh"],
      in_specs=Infer if given["in_specs"] is _UNSET else given["in_specs"],
      out_specs=given["out_specs"], check=True if check is None else bool(check),
      axis_names=None if axis_names is _UNSET else axis_names,
      auto=given["auto"], debug_info=debug_info)
  if debug_info is not None and not isinstance(debug_info, core.DebugInfo):
    raise TypeError("shard_map debug_info must be a jax DebugInfo (api_util.debug_info(...)) "
                    f"or None, but got {debug_info!r} of type {type(debug_info)}.")
  if f is None:
    return lambda g: _mapped(g, spec)
  return _mapped(f, spec)


class _Request:
  """A shard_map's arguments, as given (the mesh may come from the context)."""

  def __init__(self, *, mesh: AnyMesh | None, in_specs: Any, out_specs: Any, check: bool,
               axis_names: Set[Hashable] | None, auto: Set[Hashable] | None,
               debug_info: core.DebugInfo | None):
    self.mesh, self.in_specs, self.out_specs = mesh, in_specs, out_specs
    self.check, self.axis_names, self.auto = check, axis_names, auto
    self.debug_info = debug_info

  def resolve(self, f: Callable) -> tuple[AnyMesh, frozenset]:
    """(mesh, auto) for a call, validating the arguments against the mesh."""
    mesh = self.mesh
    context = get_abstract_mesh()
    if mesh is None:
      mesh = context
      if mesh.empty:
        raise ValueError(f"The context mesh cannot be empty. Use `{MESH_CONTEXT_API}(mesh)` "
                         "to enter into a mesh context")
    elif (CONTEXT_MESH_MUST_MATCH and not context.empty
          and getattr(mesh, "abstract_mesh", mesh) != context):
      # Axis types count: inside a partially manual body the context has those axes
      # Manual, so the whole concrete mesh passed again there is another mesh.
      raise ValueError(f"The context mesh {context} should match the mesh passed to "
                       f"shard_map {mesh}")
    if self.axis_names is not None:
      auto = errors.auto_from_axis_names(f, mesh, self.axis_names)
    else:
      # The mesh axes an enclosing vmap maps over explicitly are not the body's to
      # take: they stay with the compiler, so the batch keeps its sharding.
      auto = (errors.checked_arguments(f, mesh, frozenset(self.auto or ()))
              | (vmapped_mesh_axes() & frozenset(mesh.axis_names)))
    manual = errors.manual_names(mesh, auto, self.axis_names)
    if infers(self.in_specs):
      errors.check_inferable(mesh, manual)
    else:
      _validate_specs("in", mesh, self.in_specs, auto, manual)
    if not callable(self.out_specs):
      _validate_specs("out", mesh, self.out_specs, auto, manual)
    return mesh, auto


def _mapped(f: Callable, request: _Request) -> Callable:
  if not callable(f):
    errors.checked_arguments(f, request.mesh, frozenset())
  if request.mesh is not None and not CHECKS_ARGUMENTS_AT_CALL:
    request.resolve(f)  # the experimental shard_map's errors come when it is built

  @functools.wraps(f)
  @traceback_util.api_boundary
  def mapped(*args: Any):
    mesh, auto = request.resolve(f)
    dbg = request.debug_info or api_util.debug_info("shard_map", f, args, {})
    return _call(f, mesh, request.in_specs, request.out_specs, request.check, auto, dbg, args)
  return mapped


def _call(f: Callable, mesh: AnyMesh, in_specs: Specs, out_specs: Specs | Callable[[], Specs],
          check_rep: bool, auto: frozenset, debug_info: core.DebugInfo, args: tuple) -> Any:
  args_flat, in_tree = tree_flatten(args)
  names = debug_info.arg_names  # None possible on jax 0.10 (a debug_info= given)
  if names is None or len(names) != len(args_flat):  # only a debug_info= given can disagree
    raise ValueError(
        f"shard_map debug_info names {'no' if names is None else len(names)} arguments "
        f"{names} but the call passes {len(args_flat)} flattened arguments; "
        "build it from this call's arguments.")
  if infers(in_specs):
    specs_flat = [inferred_spec(mesh, auto, x) for x in args_flat]
    errors.check_partial_sum_specs("in", mesh, errors.manual_names(mesh, auto), specs_flat)
    in_specs = tree_unflatten(in_tree, specs_flat)
  else:
    try:
      specs_flat = broadcast_prefix(in_specs, args, is_leaf=lambda x: x is None)
    except ValueError:
      err, *_ = prefix_errors(in_specs, args)
      raise err("shard_map in_specs") from None
  # Arguments with spec None are closed over as constants, not mapped.
  dyn = [i for i, s in enumerate(specs_flat) if s is not None]
  dyn_specs = [specs_flat[i] for i in dyn]
  dbg = debug_names.for_arguments(debug_info, dyn)
  fun, out_tree = api_util.flatten_fun_nokwargs(lu.wrap_init(f, debug_info=dbg),
                                                in_tree)
  fun, dyn_args = api_util.argnums_partial(fun, tuple(dyn), args_flat, False)
  fun = debug_names.with_result_paths(fun, out_tree)
  _check_args(f, mesh, in_tree, in_specs, dyn, dyn_specs, dyn_args)
  manual = errors.manual_names(mesh, auto)
  errors.check_inputs_match_specs(mesh, manual, dyn_specs, dyn_args)
  if RESHARDS_EXPLICIT_INPUTS and errors.fully_manual_explicit(mesh, manual):
    # Older jax.shard_maps reshard such arguments to their in_specs, outside the
    # primitive: differentiating the resharding returns each cotangent in its
    # argument's own sharding.
    dyn_args = [reshard_to_spec(x, mesh, s) for x, s in zip(dyn_args, dyn_specs, strict=True)]
  in_names = tuple(canonicalize_spec(s) for s in dyn_specs)
  out_names = _OutNames(mesh, out_specs, out_tree, auto)

  try:
    outs = bind_body(fun, dyn_args, mesh=mesh, in_names=in_names,
                     out_names_thunk=out_names, check_rep=check_rep, auto=auto)
  except errors.OutputRankError as e:
    raise errors.rank_error("out", f, out_tree(), out_names.resolved_specs,
                            e.failures) from None
  except errors.OutputReplicationError as e:
    raise errors.replication_error(f, mesh, auto, out_tree(),
                                   out_names.resolved_specs, e.failures) from None
  return tree_unflatten(out_tree(), outs)


def _check_args(f: Callable, mesh: AnyMesh, in_tree: PyTreeDef, in_specs: Specs, dyn: Sequence[int],
                dyn_specs: Sequence[Any], dyn_args: Sequence[Any]) -> None:
  """Rank and divisibility of each mapped argument against its spec."""
  avals = [core.shaped_abstractify(x) for x in dyn_args]

  def spread(fails: Sequence[Any]):  # back to one entry per flat argument
    full = [None] * in_tree.num_leaves
    for i, fail in zip(dyn, fails, strict=True):
      full[i] = fail
    return full

  fails = rank_failures(dyn_specs, avals)
  if any(x is not None for x in fails):
    raise errors.rank_error("in", f, in_tree, in_specs, spread(fails))
  fails = divisibility_failures(
      mesh, [canonicalize_spec(s) for s in dyn_specs], avals)
  if any(x is not None for x in fails):
    raise errors.divisibility_error(f, mesh, in_tree, in_specs, spread(fails))
