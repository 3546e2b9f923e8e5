"""The program a pmap call stages: one ``shard_map`` over the mesh, run under ``jax.jit``.

``make_staged`` returns the function ``jax.jit`` traces. At trace time it matches the
arguments to ``in_axes`` (legacy's checks and messages), picks the devices, and calls
``shard_map`` with each mapped leaf split along its own mapped axis (block size 1 there).
The body removes that axis before calling ``fun`` and adds a leading one to each mapped
output; outside the shard_map the axis is moved to its ``out_axes`` position. Nested
pmaps met while tracing the body become extra mesh axes (see ``nesting``).
"""
from __future__ import annotations

import functools
import inspect
import math
import re
import types
from typing import Any, NamedTuple
from collections.abc import Callable

import jax
import numpy as np
from jax import lax
from jax._src import api_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jax.tree_util import tree_flatten, tree_unflatten

from pmap_compat import axes as axes_lib
from pmap_compat import arguments, body_arguments, embedded_constants, errors, inputs
from pmap_compat import key_collectives, meshes, multihost
from pmap_compat import nesting
from pmap_compat.config import PmapConfig
from shard_map_impl import shard_map


class CallArgs(NamedTuple):
  """One call's arguments matched against the config (trace time or slow path only)."""
  static: dict[int, Any]          # position -> value of each static argument
  in_tree: Any                    # treedef of (dynamic positional args, kwargs)
  leaves: list
  in_axes: tuple                  # normalised, one per leaf
  size: int

  def rebuild(self, leaves: list) -> tuple[tuple, dict]:
    """The call's ``(args, kwargs)`` with ``leaves`` in place of the dynamic leaves."""
    dyn, kwargs = tree_unflatten(self.in_tree, leaves)
    return arguments.merge_static(dyn, self.static), kwargs


def match_args(cfg: PmapConfig, fun: Callable, args: tuple, kwargs: dict) -> CallArgs:
  if cfg.devices == ():
    raise errors.no_devices()
  n = len(args)
  if cfg.static and max(cfg.static) >= n:
    raise errors.static_args_missing(cfg.static_given, n)
  dyn_list, static = arguments.split_static(args, cfg.static)
  dyn = tuple(dyn_list)
  # Matched again when jit traces (after the slow path matched to place inputs): jit
  # traces from the arguments alone, and a first call per signature pays it only once.
  in_axes = cfg.in_axes
  if static and isinstance(in_axes, tuple):
    in_axes = tuple(in_axes[i] for i in range(n) if i not in static)  # legacy's IndexError too
  leaves, in_tree = tree_flatten((dyn, kwargs))
  flat_axes = axes_lib.in_axes_per_leaf(in_axes, dyn, kwargs)
  flat_axes = tuple(axes_lib.normalise_in_axis(d, np.shape(x))
                    for x, d in zip(leaves, flat_axes, strict=True))
  # In a multi-process job axis_size is the GLOBAL size; the local size is not checked
  # against it (as legacy).
  check_size = cfg.axis_size if local_size_is_global() else None
  size = axes_lib.mapped_size(fun, dyn, kwargs, leaves, flat_axes, check_size)
  return CallArgs(static, in_tree, leaves, flat_axes, size)


def local_size_is_global() -> bool:
  return jax.process_count() == 1


def call_fun(fun: Callable, call: CallArgs, leaves: list) -> Any:
  args, kwargs = call.rebuild(leaves)
  return fun(*args, **kwargs)


class _AxisNameStandIn(str):
  """Stands for a user axis name that is not a non-empty string (``0``, ``""``, ``3``,
  ``("a", 1)``, any hashable) in meshes and specs.

  JAX's specs treat a falsy entry as "unsharded" and a tuple as several mesh axes, and
  Shardy's meshes take string axis names only, so such a name cannot be a mesh axis as is.
  This stand-in is a string (its text is only for the lowered program) that hashes and
  compares equal to the user's name, so collectives written against the user's name still
  find the mesh axis, and it prints as the user's name.
  """

  name: Any

  def __new__(cls, name: Any) -> _AxisNameStandIn:
    self = super().__new__(cls, f"_pmap_compat_name_{name!r}")
    self.name = name
    return self

  def __hash__(self) -> int:
    return hash(self.name)

  def __eq__(self, other: object) -> bool:
    other = other.name if isinstance(other, _AxisNameStandIn) else other
    return type(other) is type(self.name) and other == self.name

  def __ne__(self, other: object) -> bool:
    return not self == other

  def __repr__(self) -> str:
    return repr(self.name)


def axis_name_of(cfg: PmapConfig, depth: int, size: int) -> Any:
  name = cfg.axis_name
  if name is None:
    return nesting.default_axis_name(depth, size)
  return name if isinstance(name, str) and name else _AxisNameStandIn(name)


def in_spec(axis: int | None, name: Any) -> P:
  return P() if axis is None else P(*([None] * axis), name)


def out_axes_normalised(cfg: PmapConfig, out: Any) -> tuple:
  flat = axes_lib.out_axes_per_leaf(cfg.out_axes, out)
  return tuple(axes_lib.normalise_out_axis(d, np.ndim(y))
               for y, d in zip(tree_flatten(out)[0], flat, strict=True))


def _move_leading_axis(y: Any, dest: int) -> Any:
  if dest == 0:
    return y
  perm = list(range(1, y.ndim))
  perm.insert(dest, 0)
  return lax.transpose(y, perm)


def _varies(y: Any, names: tuple) -> Any:
  """On-device flag: does ``y`` differ between devices along ``names``? (bitwise, NaN-safe)."""
  if jax.dtypes.issubdtype(y.dtype, jax.dtypes.prng_key):
    y = jax.random.key_data(y)
  y = jax.numpy.asarray(y)
  if y.dtype == jax.dtypes.float0:
    return jax.numpy.zeros((), bool)
  if jax.numpy.iscomplexobj(y):
    y = jax.numpy.stack([y.real, y.imag])
  # Compare bit patterns: NaN == NaN, and -0.0 != +0.0 (what "identical values" means).
  bits = y.view(f"uint{y.dtype.itemsize * 8}") if jax.numpy.issubdtype(y.dtype, np.floating) else y
  first = lax.all_gather(bits, names, axis=0, tiled=False)[0]
  return lax.psum((bits != first).any().astype(np.int32), names) > 0


def stage_over(mesh: Mesh, cfg: PmapConfig, fun: Callable, call: CallArgs, name: Any,
               strict: bool) -> Any:
  """``fun`` mapped over ``mesh`` axis ``name`` (other mesh axes: nested pmaps / spread)."""
  axis_sizes = {n: s for n, s in mesh.shape.items() if n != meshes.SPREAD_AXIS}
  manual = tuple(axis_sizes)
  found: dict[str, Any] = {}
  # Tracing errors (e.g. a tracer used as a bool) name the user's function and arguments.
  dbg = body_arguments.debug_info(fun, *call.rebuild(call.leaves), call.static)
  info_name = getattr(fun, "__name__", None) or type(fun).__name__

  def body(*blocks):
    leaves = [b if d is None else lax.squeeze(b, (d,))
              for b, d in zip(blocks, call.in_axes, strict=True)]
    with nesting.outer_body(dict(axis_sizes), (name,)):
      out = embedded_constants.call(
          dbg, info_name, lambda xs: key_collectives.call_with_key_collectives(
              lambda ys: call_fun(fun, call, ys), xs), leaves)
    out_axes = out_axes_normalised(cfg, out)
    outs, found["tree"] = tree_flatten(out)
    found["axes"] = out_axes
    mapped = [lax.expand_dims(y, (0,))
              for y, d in zip(outs, out_axes, strict=True) if d is not None]
    unmapped = [y for y, d in zip(outs, out_axes, strict=True) if d is None]
    flags = [_varies(y, manual) for y in unmapped] if strict else []
    return mapped, unmapped, flags
  in_specs = tuple(in_spec(d, name) for d in call.in_axes)
  mapped, unmapped, flags = shard_map(body, mesh=mesh, in_specs=in_specs,
                                      out_specs=(P(name), P(), P()), check_rep=False,
                                      debug_info=dbg)(*call.leaves)
  mapped, unmapped = iter(mapped), iter(unmapped)
  outs = [next(unmapped) if d is None else _move_leading_axis(next(mapped), d)
          for d in found["axes"]]
  result = tree_unflatten(found["tree"], outs)
  return (result, tuple(flags)) if strict else result


def stage_top(cfg: PmapConfig, fun: Callable, args: tuple, kwargs: dict, spread: bool,
              meshes_used: dict) -> Any:
  """The outermost pmap: retrace with one more mesh axis per nested pmap discovered.

  Records the mesh per mapped size in ``meshes_used`` for the input slow path.
  """
  call = match_args(cfg, fun, args, kwargs)
  name = axis_name_of(cfg, 0, call.size)
  mesh_axes = [(name, call.size)]
  while True:
    total = math.prod(s for _, s in mesh_axes)
    # With devices=, a count that does not match yet may still be completed by nested
    # pmaps found while tracing: trace on a provisional mesh over the backend's devices
    # and decide once every nested pmap is known (legacy also checks after tracing).
    provisional = cfg.devices is not None and len(cfg.devices) != total
    if provisional and total > len(meshes.backend_devices(cfg.backend, None)):
      raise errors.nested_devices_mismatch(total, call.size, cfg.devices or ())
    mesh = meshes.build_mesh(mesh_axes, cfg.backend, None if provisional else cfg.devices,
                             spread)
    if spread:
      multihost.check_traced_use(mesh)
    try:
      out = stage_over(mesh, cfg, fun, call, name, cfg.strict_replication)
    except nesting.NeedAxis as need:
      mesh_axes.append((need.name, need.size))
      continue
    if provisional:
      raise errors.nested_devices_mismatch(total, call.size, cfg.devices or ())
    meshes_used[call.size] = mesh
    return out


def run_nested(cfg: PmapConfig, fun: Callable, frame: nesting.Frame, args: tuple,
               kwargs: dict) -> Any:
  """An inner pmap called while an outer pmap's body is traced."""
  if cfg.devices == ():
    raise errors.no_devices()
  if cfg.devices is not None:
    raise ValueError("Nested pmap with explicit devices argument.")
  call = match_args(cfg, fun, args, kwargs)
  name = axis_name_of(cfg, frame.depth, call.size)
  nesting.require_axis(frame, name, call.size)
  # Traced in a frame of its own: tracing errors name the inner function's arguments.
  dbg = body_arguments.debug_info(fun, *call.rebuild(call.leaves), call.static)
  return nesting.run_nested(name, call.leaves, call.in_axes,
                            lambda picked: body_arguments.traced_as(
                                dbg, lambda leaves: key_collectives.call_with_key_collectives(
                                    lambda xs: call_fun(fun, call, xs), leaves), picked),
                            lambda out: out_axes_normalised(cfg, out))


class FunInfo(NamedTuple):
  """What the jaxprs' DebugInfo says about the user's function (holds no reference to it)."""
  name: str
  sourceinfo: str                         # "f at file.py:12", as api_util.fun_sourceinfo
  signature: inspect.Signature | None     # None: arguments are named args[0], ...


def _argnums_fit(signature: inspect.Signature, cfg: PmapConfig) -> bool:
  """Would jit accept ``cfg``'s argnums for this signature? Legacy pmap does not check them
  when applied (a call with too few arguments gets its own error), so neither may we."""
  try:
    api_util._validate_argnums(signature, cfg.static, "static_argnums")
    api_util._validate_argnums(signature, cfg.donate, "donate_argnums")
  except ValueError:
    return False
  return True


def fun_info(fun: Callable, cfg: PmapConfig) -> FunInfo:
  named = fun
  while isinstance(named, functools.partial):  # compile logs and profiles name the function
    named = named.func
  name = getattr(named, "__name__", None) or type(named).__name__
  signature = api_util.fun_signature(fun)
  if signature is not None and not _argnums_fit(signature, cfg):
    signature = None
  return FunInfo(name, api_util.fun_sourceinfo(fun), signature)


def make_staged(fun_ref: Callable[[], Callable], cfg: PmapConfig, spread: bool,
                info: FunInfo, meshes_used: dict[int, Mesh]) -> Callable:
  """The function handed to ``jax.jit`` for this config; each trace records its mesh in
  ``meshes_used`` (mapped size -> mesh).

  It carries the user's name, source location and signature, so the DebugInfo jit builds
  for it (``api_util.debug_info``) names the user's function and arguments in errors.
  """
  def staged(*args, **kwargs):
    # Legacy pmap ignores use_mesh / set_mesh contexts (jit traces under them, and a
    # context mesh that is not the pmap's own would fail shard_map's check).
    with meshes.no_ambient_mesh():
      return stage_top(cfg, fun_ref(), args, kwargs, spread, meshes_used)
  staged.__name__ = staged.__qualname__ = info.name
  # Set before __wrapped__ below, which inspect.signature would otherwise follow.
  staged.__signature__ = (  # type: ignore[attr-defined]  # read by inspect
      info.signature if info.signature is not None else inspect.signature(staged))
  staged.__fun_sourceinfo__ = info.sourceinfo  # type: ignore[attr-defined]  # jax 0.6's jit
  located = _located(info.sourceinfo)
  if located is not None:
    staged.__wrapped__ = located  # type: ignore[attr-defined]  # jax 0.10's jit unwraps
  return staged


_SOURCE_INFO = re.compile(r"(?P<name>\S+) at (?P<file>.+):(?P<line>\d+)$")


def _template() -> None:
  """Code template for ``_located``."""


def _located(sourceinfo: str) -> Callable | None:
  """A bodiless function whose code names the user's function, file and first line.

  jax 0.10's jit describes a function by the code of ``inspect.unwrap(fun)``; handing it
  this stand-in, not the user's function itself, keeps the staged program from holding
  the user's function (the cache holds that only weakly). None when ``sourceinfo`` has
  no location ("<unknown>", a builtin).
  """
  found = _SOURCE_INFO.match(sourceinfo)
  if found is None:
    return None
  code = _template.__code__.replace(co_name=found["name"], co_filename=found["file"],
                                    co_firstlineno=int(found["line"]))
  return types.FunctionType(code, {}, found["name"])


def input_shardings(cfg: PmapConfig, fun: Callable, args: tuple, kwargs: dict, spread: bool,
                    meshes_used: dict) -> tuple[CallArgs, Mesh | None, list[NamedSharding]]:
  """Where each dynamic leaf must live for the staged program (slow path only).

  The mesh is None when it is not known before tracing.

  In a multi-process job the arguments are host-local, the mesh global: its size is
  ``axis_size`` or local size x process count (as legacy).
  """
  call = match_args(cfg, fun, args, kwargs)
  size = call.size
  if not local_size_is_global():
    size = cfg.axis_size or (len(cfg.devices) if cfg.devices else size * jax.process_count())
  mesh = meshes_used.get(size)
  if mesh is not None and not meshes.is_current(mesh):
    meshes_used.clear()  # recorded before jax.clear_backends(); tracing records them again
    mesh = None
  if mesh is None:
    if cfg.devices is not None and len(cfg.devices) != size:
      return call, None, []  # only tracing can tell (nested pmaps) or raise legacy's error
    name = axis_name_of(cfg, 0, size)
    mesh = meshes.build_mesh([(name, size)], cfg.backend, cfg.devices, spread)
  name = mesh.axis_names[0]
  return call, mesh, [NamedSharding(mesh, in_spec(d, name)) for d in call.in_axes]


def on_program_mesh(cfg: PmapConfig, fun: Callable, args: tuple, kwargs: dict,
                    meshes_used: dict) -> tuple[tuple, dict, bool] | None:
  """The call's ``(args, kwargs)`` with every input not on the program's sharding placed
  there (``inputs.onto_program_shardings``), so that calls whose inputs differ only in
  layout share one trace and one executable, and whether the C++ call cache may serve the
  signature; None when every input was in place, or when the mesh is only known after
  tracing (nested pmaps) or the arguments do not fit (jit's trace raises legacy's error)."""
  try:
    call, mesh, shardings = input_shardings(cfg, fun, args, kwargs, False, meshes_used)
    if mesh is None or len(mesh.axis_names) > 1:
      return None
    moved, servable = inputs.onto_program_shardings(call.leaves, shardings)
  except Exception:  # pylint: disable=broad-except
    return None  # the inputs themselves are the problem: jit's own error says it best
  if moved is None:
    return None
  args, kwargs = call.rebuild(moved)
  return args, kwargs, servable
