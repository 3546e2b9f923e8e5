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

from typing import Any

import jax
from jax._src import dtypes
from jax._src import mesh as mesh_lib

# jax 0.6.0: legacy pmap's C++ dispatcher and PmapSharding exist.
LEGACY_PMAP_RUNTIME: bool = jax.__version__ == "0.6.0"

if LEGACY_PMAP_RUNTIME:
  from jax._src import prng
  from jax._src.interpreters.pxla import DeviceAssignmentMismatchError
  from jax._src.interpreters.xla import canonicalize_dtype as _canonicalize
  from jax._src.pjit import pjit_p as jit_p
  from jax._src import sharding_specs as _sharding_specs
  from jax._src.sharding_impls import PmapSharding

  sharding_specs: Any = _sharding_specs  # PmapSharding's layout descriptions

  NO_CONCRETE_MESH: Any = None  # what clears the ambient concrete mesh
  # The mesh axis of an unnamed outermost pmap (legacy's name was a fresh object per call).
  DEFAULT_AXIS_NAME = "_pmap_compat_axis0"
else:
  from jax._src.pjit import jit_p  # type: ignore[attr-defined,no-redef]
  from jax._src.random import prng
  from jax._src.stages import DeviceAssignmentMismatchError  # type: ignore[attr-defined,no-redef]

  _canonicalize = dtypes.canonicalize_value  # type: ignore[attr-defined]
  sharding_specs = None  # PmapSharding's layout descriptions went with it
  NO_CONCRETE_MESH = mesh_lib.empty_concrete_mesh  # type: ignore[attr-defined]
  # 0.10.2's own jax.pmap's name, so results carry the very sharding its results carry.
  DEFAULT_AXIS_NAME = "_internal_pmap_axis_name"

  class PmapSharding:  # type: ignore[no-redef]
    """jax 0.10 has no PmapSharding: no value is one, so checks for it are simply False."""


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
           "canonicalize_value", "jit_p", "prng", "sharding_specs"]
