"""Probes the running JAX for the facts in migration_guide.md's version matrix.

  python tests/guide/jax_line_facts.py OUT.json

Writes {"jax": version, "facts": {matrix row label: the words its cell for this JAX
starts with}}. A deprecated API is caught and reported as "`DeprecationWarning`", the
matrix's word for it, so it is safe under `-W error::DeprecationWarning`.
"""
from __future__ import annotations

import json
import os
import sys
import warnings
from collections.abc import Callable

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402

DEPRECATED = "`DeprecationWarning`"


def _availability(use: Callable[[], object]) -> str:
  """'yes', DEPRECATED or 'removed': what using an API does on this JAX."""
  with warnings.catch_warnings():
    warnings.simplefilter("error", DeprecationWarning)
    try:
      use()
    except DeprecationWarning:
      return DEPRECATED
    except (AttributeError, ImportError):
      return "removed"
  return "yes"


def _imports(module: str, name: str | None = None) -> str:
  """'yes', or 'fails at import' when importing `module` (or `from module import name`) fails."""
  try:
    loaded = __import__(module, fromlist=[name] if name else [])
    if name:
      getattr(loaded, name)
  except ImportError:
    return "fails at import"
  return "yes"


def _pmap_facts() -> dict[str, str]:
  n = jax.local_device_count()
  x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
  out = jax.pmap(lambda v: v / jax.lax.psum(v, "i"), axis_name="i")(x)
  kind = type(out.sharding).__name__
  try:
    jax.pmap(jax.pmap(lambda v: jax.lax.psum(v, ("i", "j")), axis_name="j"),
             axis_name="i")(x.reshape(n // 2, 2, 3))
    nested = "works"
  except ValueError:
    nested = "fails"
  return {
      "`jax.pmap`": "legacy" if kind == "PmapSharding" else "shard_map-based",
      "nested `jax.pmap` with collectives": nested,
      "`jax.pmap` outputs, `out[0]`": f"`{kind}`",
  }


def _experimental_shard_map() -> None:
  from jax.experimental.shard_map import shard_map  # pylint: disable=import-outside-toplevel
  del shard_map


def facts() -> dict[str, str]:
  mesh_types = str(jax.make_mesh((jax.local_device_count(),), ("i",)).axis_types)
  return {
      **_pmap_facts(),
      "`PmapSharding`, `jax.device_put_replicated` / `_sharded`": _availability(
          lambda: (jax.sharding.PmapSharding, jax.device_put_replicated(1.0, jax.local_devices()))),
      "`jax.tree_map`, `jax.tree_leaves`, …": _availability(lambda: jax.tree_map(abs, [1])),
      "`jax.shard_map(f, *, mesh, in_specs, out_specs, axis_names, check_vma)`":
          "yes" if _availability(lambda: jax.shard_map) == "yes" else "—",
      "`jax.experimental.shard_map.shard_map(f, mesh, in_specs, out_specs, check_rep)`":
          _availability(_experimental_shard_map),
      "`jax.make_mesh` default axis types": "Explicit" if "Explicit" in mesh_types else "Auto",
      "`shard_map_impl`": _imports("shard_map_impl"),
      "`pmap_compat.pmap`, `patched()`": _imports("pmap_compat", "pmap"),
      "`python -m pmap_compat.testing record` / `check`": _imports("pmap_compat.testing"),
  }


if __name__ == "__main__":
  with open(sys.argv[1], "w", encoding="utf-8") as f:
    json.dump({"jax": jax.__version__, "facts": facts()}, f)
