"""Which JAX line this test process runs on, and the markers that pin a test to one.

The suite runs twice: on jax 0.6.0 (`.venv`, legacy `jax.pmap` as the in-process
reference) and on jax 0.10.2 (`.venv-jax0.10.2`, JAX's own `jax.shard_map` and
shard_map-based `jax.pmap`). A test that can only mean something on one of them says so:

  @pytest.mark.jax06_only                      # or jax06_only(reason="PmapSharding")
  @pytest.mark.jax010_only(reason="...")

and tests/conftest.py skips it elsewhere, with the reason in the skip message. A module
that imports names only jax 0.6.0 has (PmapSharding, pmap_lib) calls
`jax06_only_module(reason)` before those imports.

Between and beyond those two, JAX has been measured on every release pip serves; a test
that applies wherever JAX has some capability (whatever the release) asks `has(name)`,
which asks JAX itself (an attribute, a flag), and skips elsewhere with `requires(name)`:

  @requires("core_shard_map", "jax.shard_map's own call form")

Legacy pmap's pieces are capabilities too: "legacy_pmap" (legacy jax.pmap in-process, its C++
dispatcher: through 0.9.x), "pmap_sharding", "no_legacy_pmap" (JAX's shard_map-based
jax.pmap is the only one). Prefer them to jax06_only / jax010_only, which pin a test to one
release line and so keep it from the releases between.
"""
from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable

import jax
import numpy as np
import pytest

from support.venvs import LEGACY, NEWEST  # noqa: F401  (re-exported)
from support.legacy_pmap import legacy_reference  # noqa: F401  (re-exported)

# marker name -> (does the running jax qualify, what the test needs when it does not say)
MARKERS = {
    "jax06_only": (lambda version: version == LEGACY,
                   f"needs jax {LEGACY} in-process (legacy jax.pmap, PmapSharding, the C++ "
                   "pmap path)"),
    "jax010_only": (lambda version: version.startswith("0.10."),
                    "needs jax 0.10.x in-process (JAX's shard_map-based jax.pmap)"),
}


def _has_attr(module: str, name: str) -> Callable[[], bool]:
  return lambda: hasattr(importlib.import_module(module), name)


# capability -> (how it is asked of JAX, what it is). Each is a fact of the running JAX.
CAPABILITIES: dict[str, tuple[Callable[[], bool], str]] = {
    "core_shard_map": (_has_attr("jax", "shard_map"),
                       "jax.shard_map (JAX's shard_map in core; before it, "
                       "jax.experimental.shard_map)"),
    "experimental_shard_map": (lambda: not hasattr(jax, "shard_map"),
                               "jax.experimental.shard_map as JAX's shard_map (no jax.shard_map)"),
    "vma_switch": (_has_attr("jax._src.config", "varying_axes_in_types"),
                   "the jax_varying_axes_in_types switch (vma-off mode)"),
    "partial_sum_specs": (lambda: hasattr(jax.sharding.PartitionSpec(), "unreduced"),
                          "PartitionSpecs with unreduced/reduced axes (partial-sum types)"),
    "smap": (_has_attr("jax", "smap"), "jax.smap"),
    "explicit_vmap_axes": (_has_attr("jax._src.core", "remove_explicit_mesh_axis_names"),
                           "vmap over Explicit mesh axes seen by shard_map"),
    "pcast": (_has_attr("jax.lax", "pcast"), "jax.lax.pcast"),
    "set_mesh": (_has_attr("jax", "set_mesh"), "jax.set_mesh"),
    "legacy_pmap": (_has_attr("jax._src.lib", "pmap_lib"),
                    "legacy jax.pmap in-process (its C++ pmap dispatcher; on 0.8-0.9 behind "
                    "jax_pmap_shmap_merge=False)"),
    "pmap_sharding": (_has_attr("jax._src.sharding_impls", "PmapSharding"),
                      "PmapSharding (legacy pmap's output sharding)"),
    "no_legacy_pmap": (lambda: not has("legacy_pmap"),
                       "no legacy pmap: JAX's shard_map-based jax.pmap is its only pmap"),
    "placement_functions": (lambda: all(n in vars(jax) for n in _PLACEMENT),
                            "jax.device_put_replicated / _sharded in the jax namespace, "
                            "not deprecated"),
    "pmap_fixed_default_axis": (lambda: _pmap_default_axis_fixed(),
                                "jax.pmap names an unnamed axis alike for every function (not "
                                "after the function, '<axis 0x...>')"),
    "mesh_context_manager": (lambda: _mesh_context_undeprecated(),
                             "`with mesh:` as a mesh context, not deprecated"),
    "jit_returns_shard_maps_of_two_sizes": (
        lambda: _jit_returns_shard_maps_of_two_sizes(),
        "jit returning results of shard_maps over meshes of two sizes on the same devices "
        "(not: every GSPMD output sharding named on one mesh, IndivisibleError)"),
    "jit_returns_shard_maps_of_sizes_4_and_2": (
        lambda: _jit_returns_shard_maps_of_two_sizes(4, 2),
        "jit returning results of shard_maps over mesh axes of sizes 4 and 2 on the same 8 "
        "devices (not: IndivisibleError)"),
    "legacy_pmap_numpy_under_jit": (
        lambda: _legacy_pmap_takes_numpy_under_jit(),
        "legacy jax.pmap called with numpy arguments inside jax.jit (not: an internal "
        "'non-canonical constant' AssertionError)"),
    "staging_keeps_nested_jit_jaxprs": (
        lambda: _staging_keeps_nested_jit_jaxprs(),
        "tracing keeps the jaxpr of every jit staged inside another (its abstract-eval "
        "cache holds the equation's params strongly, up to 4,096 entries)"),
    "cached_jit_transpose": (_has_attr("jax._src.pjit", "_pjit_transpose_trace"),
                             "jit's eager transpose traced through lu.cache "
                             "(_pjit_transpose_trace: keeps each transposed jaxpr)"),
    "placement_removed": (lambda: not any(_reachable(n) for n in _PLACEMENT),
                          "jax.device_put_replicated / _sharded removed from the jax namespace"),
}


_PLACEMENT = ("device_put_replicated", "device_put_sharded")


def _reachable(name: str) -> bool:
  """Whether `jax.<name>` resolves (present, or deprecated but still there)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    return hasattr(jax, name)


@functools.cache
def _pmap_default_axis_fixed() -> bool:
  """Do results of jax.pmap over two distinct functions, unnamed axis, carry one sharding?"""
  x = np.zeros((1,), np.float32)
  return jax.pmap(lambda v: v)(x).sharding == jax.pmap(lambda v: v + 1)(x).sharding


@functools.cache
def _mesh_context_undeprecated() -> bool:
  """Does entering a Mesh (`with mesh:`) go without a DeprecationWarning?"""
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("probe",))
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with mesh:
      pass
  return not any(issubclass(w.category, DeprecationWarning) for w in caught)


@functools.cache
def _jit_returns_shard_maps_of_two_sizes(first: int = 8, second: int = 4) -> bool:
  """Does jit return the results of shard_maps over a size-`first` and a size-`second` mesh
  axis of the same 8 devices (the rest of them a second mesh axis)?"""
  shard_map = getattr(jax, "shard_map", None)
  if shard_map is None:
    from jax.experimental.shard_map import shard_map  # noqa: PLC0415  # before jax.shard_map
  devices = np.array(jax.devices()[:8])
  spec = jax.sharding.PartitionSpec("i")
  maps = [shard_map(lambda x: x * 2, mesh=jax.sharding.Mesh(devices.reshape(size, 8 // size),
                                                            ("i", "j")),
                    in_specs=spec, out_specs=spec) for size in (first, second)]
  try:
    jax.jit(lambda a, b: (maps[0](a), maps[1](b)))(np.ones((first, 1, 2), np.float32),
                                                   np.ones((second, 1, 2), np.float32))
  except ValueError:
    return False
  return True


@functools.cache
@functools.cache
def _staging_keeps_nested_jit_jaxprs() -> bool:
  import gc  # noqa: PLC0415
  import weakref  # noqa: PLC0415

  def staged() -> weakref.ref:  # the jaxpr of a fresh function jitted inside a trace
    fresh = lambda v: v + 1.0
    outer = jax.make_jaxpr(lambda v: jax.jit(fresh)(v))(1.0)
    return weakref.ref(outer.jaxpr.eqns[0].params["jaxpr"].jaxpr)
  inner = staged()
  gc.collect()
  return inner() is not None


def _legacy_pmap_takes_numpy_under_jit() -> bool:
  """Does legacy jax.pmap, called inside jax.jit with a numpy argument, trace?"""
  from support.legacy_pmap import has_legacy_pmap, legacy_pmap  # noqa: PLC0415
  if not has_legacy_pmap():
    return False
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "The jitted function .* includes a pmap", UserWarning)
    try:
      jax.jit(lambda: legacy_pmap(lambda w: w * 2)(np.ones((1, 1), np.float32)))()
    except AssertionError:
      return False
  return True


def has(capability: str) -> bool:
  """Whether the running JAX has `capability` (a key of CAPABILITIES)."""
  probe, _ = CAPABILITIES[capability]
  return probe()


def requires(capability: str, reason: str = "") -> pytest.MarkDecorator:
  """Skips a test where JAX lacks `capability`, saying which and (optionally) why."""
  _, what = CAPABILITIES[capability]
  why = f"needs {what}" + (f" ({reason})" if reason else "")
  return pytest.mark.skipif(not has(capability), reason=f"{why}; this is jax {running_jax()}")


def running_jax() -> str:
  return jax.__version__


def on_legacy_line() -> bool:
  """True on jax 0.6.0, where legacy jax.pmap can be run in-process."""
  return running_jax() == LEGACY


def skip_reason(marker: pytest.Mark, version: str) -> str | None:
  """Why a test carrying `marker` is skipped on jax `version`, or None if it runs."""
  applies, default = MARKERS[marker.name]
  if applies(version):
    return None
  if marker.args and marker.kwargs.get("reason"):
    raise TypeError(f"@pytest.mark.{marker.name}: give the reason once, positionally or as "
                    "reason=")
  if len(marker.args) > 1 or set(marker.kwargs) - {"reason"}:
    raise TypeError(f"@pytest.mark.{marker.name} takes one optional reason (a string), got "
                    f"args={marker.args!r} kwargs={marker.kwargs!r}")
  reason = marker.kwargs.get("reason", marker.args[0] if marker.args else default)
  return f"{marker.name}: {reason}; this is jax {version}"


def jax06_only_module(reason: str) -> None:
  """Skips the calling test module, with `reason`, off jax 0.6.0 (call it at module level
  before importing what only 0.6.0 has)."""
  if not on_legacy_line():
    pytest.skip(f"jax06_only: {reason}; this is jax {running_jax()}", allow_module_level=True)
