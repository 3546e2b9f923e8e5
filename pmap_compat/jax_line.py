"""Everything pmap_compat asks of JAX that differs between the releases it runs on.

Each name here answers one question by looking at what the installed JAX has (an
attribute, a module, a return shape), never at its version number; no other module of
the package looks at the JAX release.

The big one is ``LEGACY_PMAP_RUNTIME``: does this JAX still ship legacy pmap's runtime,
the C++ pmap dispatcher (``pmap_lib.pmap``), its fast-path record and ``PmapSharding``?
Every release through 0.9.x does (0.8 and 0.9 keep it behind ``jax_pmap_shmap_merge``,
whose default became True there). Where it exists pmap_compat drives that dispatcher with
its own executables and returns ``PmapSharding`` arrays, as legacy ``jax.pmap`` does on
every release that has it: legacy's semantics are the product's promise, so on 0.8–0.9
results are what ``JAX_PMAP_SHMAP_MERGE=false`` gives, not that release's default
``jax.pmap`` (``fastpath``, ``outputs``). Where it is gone (0.10.0 on) a call goes
through jit's C++ fast path, and results are the ``NamedSharding`` arrays that release's
own ``jax.pmap`` returns (``jit_dispatch``).
"""
from __future__ import annotations

import functools
import inspect
import os
import types
from typing import TYPE_CHECKING, Any

from jax._src import api as _api
from jax._src import core
from jax._src import dtypes
from jax._src import lib as _lib
from jax._src import mesh as mesh_lib
from jax._src import pjit as _pjit
from jax._src import sharding_impls as _sharding_impls
from jax._src import stages as _stages
from jax._src import tree_util
from jax._src.interpreters import mlir
from jax._src.interpreters import pxla as _pxla
from jax._src.random import prng  # the PRNG module (jax._src.prng until 0.9, re-exported here)


def _has_legacy_pmap_runtime() -> bool:
  """Legacy pmap's C++ dispatcher, the record that feeds it, and PmapSharding."""
  return (hasattr(_lib, "pmap_lib") and hasattr(_api, "_PmapFastpathData")
          and hasattr(_api, "_pmap_cache_clears")
          and hasattr(_sharding_impls, "PmapSharding"))


LEGACY_PMAP_RUNTIME: bool = _has_legacy_pmap_runtime()

sharding_specs: Any  # PmapSharding's layout descriptions

if LEGACY_PMAP_RUNTIME:
  from jax._src import sharding_specs as _sharding_specs
  from jax._src.sharding_impls import PmapSharding

  sharding_specs = _sharding_specs
  # The mesh axis of an unnamed outermost pmap (legacy's name was a fresh object per call).
  DEFAULT_AXIS_NAME = "_pmap_compat_axis0"
else:
  sharding_specs = None  # PmapSharding's layout descriptions went with it
  # The release's own jax.pmap's name, so results carry the very sharding its results carry.
  DEFAULT_AXIS_NAME = "_internal_pmap_axis_name"

  if TYPE_CHECKING:
    from jax.sharding import Sharding as _ShardingBase
  else:
    _ShardingBase = object

  class PmapSharding(_ShardingBase):  # type: ignore[no-redef, unused-ignore]
    """A JAX without legacy pmap's runtime has no PmapSharding: no value is one, so checks
    for it are simply False.

    The type checker sees legacy's surface, which code run with the legacy runtime only
    (outputs.py) uses; at run time the class is empty.
    """
    if TYPE_CHECKING:
      devices: Any
      sharding_spec: Any

      def __init__(self, devices: Any, sharding_spec: Any) -> None: ...


# The primitive a staged jax.jit call binds (pjit_p until 0.6, jit_p from 0.7).
jit_p: Any
if hasattr(_pjit, "jit_p"):
  jit_p = _pjit.jit_p
else:
  jit_p = _pjit.pjit_p  # type: ignore[attr-defined, unused-ignore]

# What jit raises when a call's inputs sit on devices other than its program's (pxla until
# 0.6, stages from 0.7).
DeviceAssignmentMismatchError: type[Exception]
if hasattr(_stages, "DeviceAssignmentMismatchError"):
  DeviceAssignmentMismatchError = _stages.DeviceAssignmentMismatchError
else:
  DeviceAssignmentMismatchError = (
      _pxla.DeviceAssignmentMismatchError)  # type: ignore[attr-defined, unused-ignore]

# jit's own trace of a call, ``(fun, jit_info, args, kwargs) -> (PjitParams, flat args)``:
# ``pjit._infer_params``, which 0.9.0 alone names ``_trace_for_jit``.
infer_jit_params: Any
if hasattr(_pjit, "_infer_params"):
  infer_jit_params = _pjit._infer_params
else:
  infer_jit_params = _pjit._trace_for_jit  # type: ignore[attr-defined, unused-ignore]

def lowering_args(args_flat: list) -> list:
  """What jit's lowering (``pjit._resolve_and_lower``) takes for each argument: its meta
  type (aval, sharding, format, committed) where jit converts to one (0.8.2 on: typed key
  arrays have no ``format`` there), the argument itself before."""
  if hasattr(_pjit, "convert_to_metaty"):
    return [_pjit.convert_to_metaty(a) for a in args_flat]
  return list(args_flat)


# jit's wording of a DeviceAssignmentMismatchError, ``(fun_name, fails, args_flat,
# api_name, arg_names) -> str`` (pjit's until 0.6.0, stages' from 0.6.2).
device_assignment_mismatch_error: Any
if hasattr(_stages, "_device_assignment_mismatch_error"):
  device_assignment_mismatch_error = _stages._device_assignment_mismatch_error
else:
  device_assignment_mismatch_error = (
      _pjit._device_assignment_mismatch_error)  # type: ignore[attr-defined, unused-ignore]

# What clears the ambient concrete mesh for ``_internal_use_concrete_mesh``: its empty mesh
# where the release has one (0.7 on), None before.
NO_CONCRETE_MESH: Any = getattr(mesh_lib, "empty_concrete_mesh", None)


def _dtype_canonicalizer() -> Any:
  """jit's dispatch-time dtype canonicalisation (``dtypes.canonicalize_value`` from 0.7,
  ``xla.canonicalize_dtype`` before)."""
  if hasattr(dtypes, "canonicalize_value"):
    return dtypes.canonicalize_value
  from jax._src.interpreters import xla  # type: ignore[attr-defined, unused-ignore]
  return xla.canonicalize_dtype  # type: ignore[attr-defined, unused-ignore]


_canonicalize = _dtype_canonicalizer()


def _jit_cpp_module() -> Any:
  """The C++ extension that holds jit's call cache (``_jax`` from 0.7, ``xla_extension``
  before)."""
  if hasattr(_lib, "_jax"):
    return _lib._jax
  return _lib.xla_extension  # type: ignore[attr-defined, unused-ignore]


def jit_call_cache(name: str, fun: Any, cache_miss: Any, static_argnums: tuple) -> Any:
  """Without legacy pmap's runtime: a C++ call cache of jit's own kind in front of
  ``cache_miss``.

  On a signature it has seen (tree, avals, shardings, static arguments, trace state) it
  runs the executable jit compiled without entering Python; on anything else it calls
  ``cache_miss(*args, **kwargs)``, which returns ``(outputs, fastpath_data, rebuild)`` as
  jit's own cache miss does (see ``served_by_python``). Its entries live in jit's global
  call cache under ``fun`` (held weakly there, so they go with ``fun``) and a key of ours,
  apart from the jit objects' own entries; ``jax.clear_caches()`` empties them.
  """
  # Imported here: internals of jit that only this path drives.
  from jax._src import tree_util as _tree_util
  return _jit_cpp_module().pjit(name, fun, cache_miss, static_argnums, (), _CALL_CACHE_KEY,
                                _tree_util.dispatch_registry, _pxla.cc_shard_arg,
                                _pjit._get_cpp_global_cache(False))


_CALL_CACHE_KEY = "pmap_compat.jit_dispatch"


def jit_cache_miss(jitted: Any) -> Any:
  """jit's Python cache miss for the jit object ``jitted``: runs the call and returns
  ``(outputs, fastpath_data, rebuild)``, what ``jit_call_cache`` needs to serve the
  signature from C++ from then on."""
  return jitted._cache_miss


def jitted_function(jitted: Any) -> Any:
  """The function a jit object stages (kept as ``_fun``)."""
  return jitted._fun


def served_by_python(outputs: Any) -> tuple[Any, None, bool]:
  """A cache miss's answer for a call the C++ cache must not serve: this call's results,
  no fast-path data (so the signature keeps coming back to Python)."""
  return outputs, None, False


def canonicalize_value(x: Any) -> Any:
  """``x`` with its dtype canonicalised as jit's dispatch does (TypeError / ValueError for
  a value that is not a JAX type)."""
  return _canonicalize(x)


def bind_parts(primitive: Any, params: dict) -> tuple[list, dict]:
  """``(subfuns, params)`` to bind ``primitive`` again with an equation's params.
  ``get_bind_params`` returns that pair until 0.9 and, from 0.10 (primitives take no
  function arguments), the params alone."""
  parts = primitive.get_bind_params(params)
  if isinstance(parts, tuple):
    return parts
  return [], parts


@functools.cache
def _lowering_strips_trailing_underscores() -> bool:
  """Does this JAX's lowering name a module ``transform(name)`` sanitised with trailing
  underscores stripped (``jit(f_)`` -> ``jit_f``), rather than ``transform_name`` as is
  (``jit_f_``)? Asked by lowering a function whose name ends in one (done once, on first
  use: lowering needs the backend, which import must not start)."""
  def probe_(x: Any) -> Any:
    return x
  module: Any = _api.jit(probe_).lower(0).compiler_ir()
  return str(module.operation.attributes["sym_name"]).strip('"') == "jit_probe"


def legacy_program_name(fun_name: str) -> str:
  """The HLO module name legacy pmap gives the program of ``fun_name``: on a release with
  legacy pmap, as that release's legacy names it (``pmap(<lambda>)`` sanitised and
  stripped, ``pmap__lambda``, where its lowering strips trailing underscores); elsewhere
  as the last legacy without that stripping named it (``pmap__lambda_``), the recorded
  reference where no legacy remains."""
  name = mlir.sanitize_name(f"pmap_{fun_name}")
  if LEGACY_PMAP_RUNTIME and _lowering_strips_trailing_underscores():
    return mlir.sanitize_name(f"pmap({fun_name})").rstrip("_")
  return name


def _closure(fun: types.FunctionType) -> dict[str, Any]:
  """A function's closure variables by name (empty cells left out)."""
  found = {}
  for name, cell in zip(fun.__code__.co_freevars, fun.__closure__ or (), strict=True):
    try:
      found[name] = cell.cell_contents
    except ValueError:  # not assigned yet
      continue
  return found


def _positional_donations(donate: tuple, static: tuple) -> tuple[int, ...]:
  """pmap keeps donate_argnums counted among the non-static arguments; as the user wrote
  them, they count every positional argument."""
  if not donate:
    return ()
  dynamic = [i for i in range(max(donate) + len(static) + 1) if i not in static]
  return tuple(dynamic[d] for d in donate)


def _unnamed_axis(axis_name: Any, fun: Any) -> bool:
  """Was ``axis_name`` made up by JAX's pmap for a call without one? Legacy keeps a
  ``core._TempAxisName`` (0.8–0.9's shard_map-based pmap its repr), 0.10 a fixed string."""
  temp = getattr(core, "_TempAxisName", None)
  if temp is not None and (isinstance(axis_name, temp) or axis_name == repr(temp(fun))):
    return True
  return axis_name == "_internal_pmap_axis_name"


def prebuilt_pmap(obj: Any) -> tuple[Any, dict[str, Any]] | None:
  """``(fun, pmap's keyword arguments)`` of a function JAX's own ``jax.pmap`` returned,
  read back from what that pmap keeps; None for any other object. Raises LookupError for
  one that JAX's pmap made but keeps its arguments in a form not known here. ``patch()``
  rebuilds such functions with ours.

  Legacy pmap's ``PmapFunction`` keeps the partial application of ``_prepare_pmap`` (its
  parameters named as in the signature) and the axis name; the shard_map-based pmap (0.8
  on) returns a function whose ``infer_params`` closes over the arguments by name."""
  if type(obj).__name__ == "PmapFunction":
    prepare = getattr(obj, "_prepare_pmap", None)
    if not (isinstance(prepare, functools.partial)
            and prepare.func is getattr(_api, "_prepare_pmap", None)):
      return None
    # The partial binds every parameter but the call's own args and kwargs.
    bound = dict(zip(inspect.signature(prepare.func).parameters, prepare.args, strict=False))
    names = {"in_axes": "in_axes", "out_axes": "out_axes", "in_devices": "devices",
             "backend_name": "backend", "axis_size": "axis_size"}
    if not {"fun", "static_broadcasted_tuple", "donate_tuple", *names} <= bound.keys():
      raise LookupError(f"legacy pmap's _prepare_pmap takes {sorted(bound)}")
    fun, axis_name = bound["fun"], getattr(obj, "_axis_name", None)
    kwargs = {ours: bound[theirs] for theirs, ours in names.items()}
    static, donate = bound["static_broadcasted_tuple"], bound["donate_tuple"]
  elif (isinstance(obj, types.FunctionType) and obj.__code__.co_name == "wrapped"
        and "infer_params" in obj.__code__.co_freevars
        and obj.__code__.co_filename.startswith(_JAX_SOURCE)):
    infer = _closure(obj).get("infer_params")
    cells = _closure(infer) if isinstance(infer, types.FunctionType) else {}
    fun = cells.get("f", getattr(obj, "__wrapped__", None))
    if "out_axes_tree" in cells and "out_axes_flat" in cells:
      cells["out_axes"] = tree_util.tree_unflatten(cells["out_axes_tree"],
                                                   cells["out_axes_flat"])
    wanted = ("axis_name", "in_axes", "out_axes", "devices", "backend", "axis_size",
              "static_broadcasted_tuple", "donate_tuple")
    if fun is None or not all(name in cells for name in wanted):
      raise LookupError(f"the shard_map-based pmap keeps {sorted(cells)}")
    axis_name = cells["axis_name"]
    kwargs = {name: cells[name] for name in wanted[1:6]}
    static, donate = cells["static_broadcasted_tuple"], cells["donate_tuple"]
  else:
    return None
  kwargs.update(axis_name=None if _unnamed_axis(axis_name, fun) else axis_name,
                static_broadcasted_argnums=static,
                donate_argnums=_positional_donations(donate, static))
  return fun, kwargs


_JAX_SOURCE = os.path.dirname(os.path.dirname(_api.__file__))

PRNGKeyArray = prng.PRNGKeyArray

__all__ = ["LEGACY_PMAP_RUNTIME", "DEFAULT_AXIS_NAME", "NO_CONCRETE_MESH",
           "DeviceAssignmentMismatchError", "PRNGKeyArray", "PmapSharding", "bind_parts",
           "device_assignment_mismatch_error", "infer_jit_params", "lowering_args",
           "canonicalize_value", "jit_cache_miss", "jit_call_cache", "jit_p", "jitted_function",
           "legacy_program_name", "prebuilt_pmap", "prng", "served_by_python", "sharding_specs"]
