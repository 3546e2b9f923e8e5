"""JAX's own shard_map on the running JAX line: the reference ours is compared with.

``jax.experimental.shard_map.shard_map`` before JAX has ``jax.shard_map`` (0.6.0),
``jax.shard_map`` from then on (0.6.2 and newer).
``jax_shard_map`` takes the 0.6 call form the test programs are written in
(``f, mesh, in_specs, out_specs, check_rep=, auto=``) and translates it to
``jax.shard_map``'s keywords where that is the reference (``check_vma``, ``axis_names``).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

import jax
import pytest
from jax._src import config

from support.jax_lines import has, requires

# The reference is jax.experimental.shard_map (JAX has no jax.shard_map yet).
LEGACY = not has("core_shard_map")

if LEGACY:
  from jax.experimental.shard_map import shard_map as _experimental_shard_map
  from jax.experimental.shard_map import shard_map_p as jax_shard_map_p
else:
  from jax._src.shard_map import shard_map_p as jax_shard_map_p  # noqa: F401

# Settings of jax_varying_axes_in_types a test can run under (without the switch, JAX
# always types vma).
VMA_MODES = (True, False) if has("vma_switch") else (True,)
# The check flag's keyword in JAX's shard_map, and in its error messages.
CHECK_ARG = "check_rep" if LEGACY else "check_vma"


def pvary(x: Any, axes: Any) -> Any:
  """Mark ``x`` device-varying over ``axes`` (lax.pcast where JAX has it, else lax.pvary)."""
  if not has("pcast"):
    return jax.lax.pvary(x, axes)
  return jax.lax.pcast(x, axes, to="varying")


def use_mesh(mesh: Any) -> Any:
  """The context mesh manager (jax.set_mesh where JAX has it, else jax.sharding.use_mesh)."""
  return jax.set_mesh(mesh) if has("set_mesh") else jax.sharding.use_mesh(mesh)


def jax_shard_map(f: Callable, mesh: Any, in_specs: Any, out_specs: Any,
                  check_rep: bool = True, auto: frozenset[Hashable] = frozenset()) -> Callable:
  if LEGACY:
    return _experimental_shard_map(f, mesh, in_specs, out_specs, check_rep=check_rep, auto=auto)
  manual = frozenset(a for a in mesh.axis_names if a not in auto) if auto else frozenset()
  return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                       check_vma=check_rep, axis_names=manual)


T = TypeVar("T")


def outcomes_or_same_error(impls: dict[str, Callable], run: Callable[[Callable], T]
                           ) -> dict[str, T] | None:
  """``run(smap)`` for each of ``impls`` ("jax" first, then "ours"), by name.

  Where JAX's own shard_map raises, ours must raise the same error (type and message)
  and None is returned: there is nothing else to compare. (JAX 0.8.2's vmap of a psum
  in a checked body binds psum_invariant with the axis_index_groups its own abstract
  eval rejects, a JAX bug; ours, running JAX's batching rule, matches it.)
  """
  results: dict[str, T] = {}
  failed: dict[str, tuple[type, str]] = {}
  for name, smap in impls.items():
    try:
      results[name] = run(smap)
    except Exception as e:  # noqa: BLE001  (compared with JAX's own below)
      if "jax" not in failed and name != "jax":
        raise
      failed[name] = (type(e), str(e))
  if failed:
    assert failed.get("ours") == failed["jax"], failed
    return None
  return results


@contextlib.contextmanager
def vma_mode(vma: bool) -> Iterator[None]:
  """jax_varying_axes_in_types for one run (where JAX has the switch; else always on)."""
  if has("vma_switch"):
    with config.varying_axes_in_types(vma):  # type: ignore[attr-defined]
      yield
  else:
    assert vma, "this jax always types varying manual axes"
    yield


@contextlib.contextmanager
def settings(shardy: bool, vma: bool) -> Iterator[None]:
  """Partitioner and varying-axes mode for one run (both are jit cache keys)."""
  with config.use_shardy_partitioner(shardy), vma_mode(vma):
    yield


def vma_params(*values: bool) -> list:
  """pytest params for a vma flag; vma-off runs need the jax_varying_axes_in_types switch."""
  return [pytest.param(v, marks=() if v else (requires("vma_switch"),)) for v in values]
