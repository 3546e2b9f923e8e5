"""Public entry point: ``shard_map(f, mesh, in_specs, out_specs, ...)``.

Validates arguments, flattens pytrees, matches specs to arguments (tree
prefixes, ``None`` for unsharded arguments), and binds ``shard_map_p`` on the
flattened body (``binding``).  Output specs are resolved lazily (after the body is traced),
which is also what allows ``out_specs`` to be a thunk.
"""
from __future__ import annotations

import functools
from typing import Any
from collections.abc import Callable, Hashable, Sequence

from jax._src import api_util
from jax._src import core
from jax._src import linear_util as lu
from jax._src import traceback_util
from jax._src.mesh import AbstractMesh, Mesh
from jax._src.tree_util import broadcast_prefix, prefix_errors
from jax.tree_util import PyTreeDef, tree_flatten, tree_unflatten

from shard_map_impl import debug_names, errors
from shard_map_impl.binding import bind_body
from shard_map_impl.specs import (AnyMesh, AxisNames, Specs, canonicalize_spec,
                                 divisibility_failures, rank_failures, spec_leaf_problems,
                                 specs_are_valid)

traceback_util.register_exclusion(__file__)


def _validate_specs(kind: str, specs: Specs, auto: frozenset) -> None:
  if kind == "in" and specs is None:
    raise errors.in_specs_none()
  if not specs_are_valid(specs, auto):
    raise errors.bad_spec_leaves(kind, *spec_leaf_problems(specs, auto), auto)


class _OutNames:
  """Memoised thunk: flat out_specs (canonical) once the output tree is known."""

  def __init__(self, out_specs: Specs | Callable[[], Specs], out_tree: Callable, auto: frozenset):
    self._specs, self._out_tree, self._auto = out_specs, out_tree, auto
    self._value: tuple[AxisNames, ...] | None = None
    self.resolved_specs: Specs = None

  def __call__(self) -> tuple[AxisNames, ...]:
    if self._value is None:
      specs = self._specs() if callable(self._specs) else self._specs
      if callable(self._specs):
        _validate_specs("out", specs, self._auto)
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


@traceback_util.api_boundary
def shard_map(f: Callable, mesh: Mesh | AbstractMesh, in_specs: Specs,
              out_specs: Specs | Callable[[], Specs], check_rep: bool = True,
              auto: frozenset[Hashable] = frozenset(),
              debug_info: core.DebugInfo | None = None) -> Callable:
  """Map ``f`` over shards of its arguments, as ``jax.experimental.shard_map``.

  Args:
    f: the per-device function.
    mesh: a ``jax.sharding.Mesh`` or ``AbstractMesh``; its axis names may be
      used by collectives inside ``f``.
    in_specs: pytree prefix of the argument tuple with ``PartitionSpec``
      leaves (``None`` for an argument passed unsharded as a constant).
    out_specs: pytree prefix of ``f``'s output with ``PartitionSpec`` leaves
      (or a thunk returning one); unmentioned mesh axes promise replication.
    check_rep: verify that promise statically (and enable the efficient
      transpose).
    auto: mesh axes left to the compiler (partially manual shard_map).
    debug_info: how tracing errors and jaxprs describe ``f`` and its arguments
      (``api_util.debug_info(...)`` for ``f`` applied to the arguments the mapped
      function is called with, one name per flattened argument). For an API built on
      shard_map that wants its own name in errors ("... for pmap"). Default: built
      per call as ``api_util.debug_info("shard_map", f, args, {})``.

  Returns:
    The mapped function, taking global arrays and returning global arrays.
  """
  auto = errors.checked_arguments(f, mesh, auto)
  if debug_info is not None and not isinstance(debug_info, core.DebugInfo):
    raise TypeError("shard_map debug_info must be a jax DebugInfo (api_util.debug_info(...)) "
                    f"or None, but got {debug_info!r} of type {type(debug_info)}.")
  _validate_specs("in", in_specs, auto)
  if not callable(out_specs):
    _validate_specs("out", out_specs, auto)

  @functools.wraps(f)
  @traceback_util.api_boundary
  def mapped(*args: Any):
    dbg = debug_info or api_util.debug_info("shard_map", f, args, {})
    return _call(f, mesh, in_specs, out_specs, check_rep, auto, dbg, args)
  return mapped


def _call(f: Callable, mesh: AnyMesh, in_specs: Specs, out_specs: Specs | Callable[[], Specs],
          check_rep: bool, auto: frozenset, debug_info: core.DebugInfo, args: tuple) -> Any:
  args_flat, in_tree = tree_flatten(args)
  if len(debug_info.arg_names) != len(args_flat):  # only a debug_info= given can disagree
    raise ValueError(
        f"shard_map debug_info names {len(debug_info.arg_names)} arguments "
        f"{debug_info.arg_names} but the call passes {len(args_flat)} flattened arguments; "
        "build it from this call's arguments.")
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
  _check_args(f, mesh, in_tree, in_specs, dyn, dyn_specs, dyn_args)
  in_names = tuple(canonicalize_spec(s) for s in dyn_specs)
  out_names = _OutNames(out_specs, out_tree, auto)

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
