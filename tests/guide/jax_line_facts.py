"""Probes the running JAX for the facts in migration_guide.md's version matrix.

  python tests/guide/jax_line_facts.py OUT.json

Writes {"jax": version, "facts": {matrix row label: the words its cell for this JAX
starts with}}. A deprecated API is caught and reported as "`DeprecationWarning`", the
matrix's word for it, so it is safe under `-W error::DeprecationWarning`. The project's
own rows are run, not just imported: `shard_map_impl` must agree with this line's JAX
shard_map and `pmap_compat` must run a nested pmap like the flat `jax.pmap`.
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


def _works(check: Callable[[], object]) -> str:
  """'yes' when `check` runs (it asserts agreement with JAX), 'fails at import' when the
  module it needs does not import on this JAX."""
  try:
    check()
  except ImportError:
    return "fails at import"
  return "yes"


def _shard_map_impl_agrees() -> None:
  """One collective program through shard_map_impl and through this line's JAX shard_map."""
  import shard_map_impl  # pylint: disable=import-outside-toplevel
  from jax.sharding import PartitionSpec as P  # pylint: disable=import-outside-toplevel
  reference = getattr(jax, "shard_map", None)
  if reference is None:  # jax 0.6.0: the experimental one, by keyword
    from jax.experimental.shard_map import shard_map as reference  # pylint: disable=import-outside-toplevel
  mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("i", "j"))
  x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
  def body(b):
    return np.float32(2) * b - jax.lax.psum(b, ("i", "j"))
  ours, theirs = (jax.jit(impl(body, mesh=mesh, in_specs=P(("i", "j")), out_specs=P(("i", "j"))))(x)
                  for impl in (shard_map_impl.shard_map, reference))
  np.testing.assert_array_equal(ours, theirs)


def _pmap_compat_runs_nested() -> None:
  """A nested pmap with a collective over both axes through pmap_compat equals the flat
  jax.pmap of the same computation (which every line's jax.pmap runs)."""
  from pmap_compat import pmap  # pylint: disable=import-outside-toplevel
  n = jax.local_device_count()
  x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
  def body(v, axes):
    return v - jax.lax.psum(v, axes)
  nested = pmap(pmap(lambda v: body(v, ("a", "b")), axis_name="b"), axis_name="a")
  flat = jax.pmap(lambda v: body(v, "a"), axis_name="a")
  np.testing.assert_array_equal(nested(x.reshape(n // 2, 2, 3)).reshape(n, 3), flat(x))


def _grad_of_replicated_params() -> str:
  """What ``jax.grad`` of a per-device loss w.r.t. ``P()`` parameters gives inside this
  line's JAX shard_map with its replication checking on (the default): the per-device
  gradient, the sum over devices, or an error."""
  from jax.sharding import PartitionSpec as P  # pylint: disable=import-outside-toplevel
  shard_map = getattr(jax, "shard_map", None)
  if shard_map is None:
    from jax.experimental.shard_map import shard_map  # pylint: disable=import-outside-toplevel
  n = jax.local_device_count()
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:n]), ("batch",))
  w, x = np.float32(2.0), np.arange(1, n + 1, dtype=np.float32)

  def body(w, xb):
    return jax.grad(lambda w: jax.numpy.sum((w * xb) ** 2))(w)[None]

  try:
    grads = np.asarray(jax.jit(shard_map(body, mesh=mesh, in_specs=(P(), P("batch")),
                                         out_specs=P("batch")))(w, x))
  except ValueError:
    return "`ValueError`"
  per_device = 2 * w * x ** 2
  if np.allclose(grads, per_device):
    return "the per-device gradient"
  assert np.allclose(grads, per_device.sum()), grads
  return "summed"


def _codemod_default_target() -> str:
  from codemod.targets import installed_target  # pylint: disable=import-outside-toplevel
  return installed_target()


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
  with warnings.catch_warnings():  # 0.8 warns that its Auto default becomes Explicit in 0.9
    warnings.filterwarnings("ignore", message="The default axis_types will change",
                            category=DeprecationWarning)
    mesh = jax.make_mesh((jax.local_device_count(),), ("i",))
  mesh_types = str(getattr(mesh, "axis_types", "Auto"))  # 0.4.35: no axis types, all Auto
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
      "`jax.grad` of a per-device loss w.r.t. `P()` params, checking on":
          _grad_of_replicated_params(),
      "`shard_map_impl`": _works(_shard_map_impl_agrees),
      "`pmap_compat.pmap`, `patched()`": _works(_pmap_compat_runs_nested),
      "codemod's default `--target` where the repository declares no jax (the tool itself needs "
      "only libcst)": _codemod_default_target(),
      "`python -m pmap_compat.testing record` / `check`": _works(
          lambda: __import__("pmap_compat.testing")),
  }


if __name__ == "__main__":
  with open(sys.argv[1], "w", encoding="utf-8") as f:
    json.dump({"jax": jax.__version__, "facts": facts()}, f)
