"""Everything pmap_compat does differently on its two JAX lines, 0.6.0 and 0.10.2.

On 0.6.0 legacy pmap's runtime still exists: the C++ pmap dispatcher
(``pmap_lib.pmap``) and ``PmapSharding``. pmap_compat drives the dispatcher with its
own executables and returns ``PmapSharding`` arrays, as legacy did (``fastpath``,
``outputs``: 0.6-only modules). 0.10.0 removed both: there a call goes through jit's
C++ fast path, and results are the ``NamedSharding`` arrays 0.10.2's own ``jax.pmap``
returns (``jit_dispatch``).

Besides that split this module only re-exports JAX internals that moved or were
renamed between the lines. No other module of the package looks at the JAX version.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax
from jax._src import dtypes
from jax._src import mesh as mesh_lib

# jax 0.6.0: legacy pmap's C++ dispatcher and PmapSharding exist.
LEGACY_PMAP_RUNTIME: bool = jax.__version__ == "0.6.0"

sharding_specs: Any  # PmapSharding's layout descriptions

if LEGACY_PMAP_RUNTIME:
  from jax._src import prng
  from jax._src.interpreters.pxla import DeviceAssignmentMismatchError
  from jax._src.interpreters.xla import canonicalize_dtype as _canonicalize
  from jax._src.pjit import pjit_p as jit_p
  from jax._src import sharding_specs as _sharding_specs
  from jax._src.sharding_impls import PmapSharding

  sharding_specs = _sharding_specs

  NO_CONCRETE_MESH: Any = None  # what clears the ambient concrete mesh
  # The mesh axis of an unnamed outermost pmap (legacy's name was a fresh object per call).
  DEFAULT_AXIS_NAME = "_pmap_compat_axis0"
else:
  from jax._src.pjit import jit_p  # type: ignore[attr-defined, no-redef, unused-ignore]
  from jax._src.random import prng
  from jax._src.stages import DeviceAssignmentMismatchError  # type: ignore[attr-defined, no-redef, unused-ignore]

  _canonicalize = dtypes.canonicalize_value  # type: ignore[attr-defined, unused-ignore]
  sharding_specs = None  # PmapSharding's layout descriptions went with it
  NO_CONCRETE_MESH = mesh_lib.empty_concrete_mesh  # type: ignore[attr-defined, unused-ignore]
  # 0.10.2's own jax.pmap's name, so results carry the very sharding its results carry.
  DEFAULT_AXIS_NAME = "_internal_pmap_axis_name"

  if TYPE_CHECKING:
    from jax.sharding import Sharding as _ShardingBase
  else:
    _ShardingBase = object

  class PmapSharding(_ShardingBase):  # type: ignore[no-redef, unused-ignore]
    """jax 0.10 has no PmapSharding: no value is one, so checks for it are simply False.

    The type checker sees legacy's surface, which code run on jax 0.6 only (outputs.py)
    uses; at run time the class is empty.
    """
    if TYPE_CHECKING:
      devices: Any
      sharding_spec: Any

      def __init__(self, devices: Any, sharding_spec: Any) -> None: ...


def jit_call_cache(name: str, fun: Any, cache_miss: Any, static_argnums: tuple) -> Any:
  """jax 0.10: a C++ call cache of jit's own kind in front of ``cache_miss``.

  On a signature it has seen (tree, avals, shardings, static arguments, trace state) it
  runs the executable jit compiled without entering Python; on anything else it calls
  ``cache_miss(*args, **kwargs)``, which returns ``(outputs, fastpath_data, rebuild)`` as
  jit's own cache miss does (see ``served_by_python``). Its entries live in jit's global
  call cache under ``fun`` (held weakly there, so they go with ``fun``) and a key of ours,
  apart from the jit objects' own entries; ``jax.clear_caches()`` empties them.
  """
  # Imported here: internals of jax 0.10's jit that this jax 0.10-only function drives.
  from jax._src import pjit as _pjit
  from jax._src import tree_util as _tree_util
  from jax._src.interpreters import pxla as _pxla
  from jax._src.lib import _jax  # type: ignore[attr-defined, unused-ignore]  # jax 0.10 only
  return _jax.pjit(name, fun, cache_miss, static_argnums, (), _CALL_CACHE_KEY,
                   _tree_util.dispatch_registry, _pxla.cc_shard_arg,
                   _pjit._get_cpp_global_cache(False))


_CALL_CACHE_KEY = "pmap_compat.jit_dispatch"


def jit_cache_miss(jitted: Any) -> Any:
  """jax 0.10: jit's Python cache miss for the jit object ``jitted``: runs the call and
  returns ``(outputs, fastpath_data, rebuild)``, what ``jit_call_cache`` needs to serve
  the signature from C++ from then on."""
  return jitted._cache_miss


def jitted_function(jitted: Any) -> Any:
  """The function a jit object stages (jax 0.10 keeps it as ``_fun``)."""
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
  """``(subfuns, params)`` to bind ``primitive`` again with an equation's params (jax 0.10's
  primitives take no function arguments: its ``get_bind_params`` returns params only)."""
  if LEGACY_PMAP_RUNTIME:
    return primitive.get_bind_params(params)
  return [], primitive.get_bind_params(params)


PRNGKeyArray = prng.PRNGKeyArray

__all__ = ["LEGACY_PMAP_RUNTIME", "DEFAULT_AXIS_NAME", "NO_CONCRETE_MESH",
           "DeviceAssignmentMismatchError", "PRNGKeyArray", "PmapSharding", "bind_parts",
           "canonicalize_value", "jit_cache_miss", "jit_call_cache", "jit_p", "jitted_function",
           "prng", "served_by_python", "sharding_specs"]
