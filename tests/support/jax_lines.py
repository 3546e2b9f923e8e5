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
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

import jax
import pytest

from support.venvs import LEGACY, NEWEST  # noqa: F401  (re-exported)

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
    "manual_axis_types": (_has_attr("jax._src.core", "ManualAxisType"),
                          "avals typed with unreduced/reduced manual axes (ManualAxisType)"),
    "smap": (_has_attr("jax", "smap"), "jax.smap"),
    "explicit_vmap_axes": (_has_attr("jax._src.core", "remove_explicit_mesh_axis_names"),
                           "vmap over Explicit mesh axes seen by shard_map"),
    "pcast": (_has_attr("jax.lax", "pcast"), "jax.lax.pcast"),
    "set_mesh": (_has_attr("jax", "set_mesh"), "jax.set_mesh"),
}


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
