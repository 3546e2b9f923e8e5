"""The smoke program a JAX release's interpreter runs (tests/test_release_smoke.py).

  python tests/support/release_smoke.py CONVERTED_DIR

One program per part of the project, each against that release's own reference, and a
JSON line on stdout saying what was checked; any disagreement raises (exit status 1).
CONVERTED_DIR holds the codemod's output of CODEMOD_PROGRAM, one folder per --target.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if __package__:  # imported by the suite
  from support.legacy_pmap import has_legacy_pmap, legacy_on, reference_pmap
else:  # run as a script, from tests/support (tests/ itself must stay off sys.path: it has
  # folders named like the packages)
  from legacy_pmap import has_legacy_pmap, legacy_on, reference_pmap  # type: ignore[no-redef]

CODEMOD_PROGRAM = os.path.join(TESTS, "codemod", "fixtures", "collectives.py")
TARGETS = ("jax", "experimental")  # the codemod's --target values


def _assert_same(expected: Any, actual: Any, what: str) -> None:
  """Same tree, shapes, dtypes and bits."""
  e_leaves, e_tree = jax.tree.flatten(expected)
  a_leaves, a_tree = jax.tree.flatten(actual)
  assert e_tree == a_tree, f"{what}: tree {a_tree} differs from the reference's {e_tree}"
  for i, (e, a) in enumerate(zip(e_leaves, a_leaves, strict=True)):
    e, a = np.asarray(e), np.asarray(a)
    assert (e.shape, e.dtype) == (a.shape, a.dtype), (
        f"{what}, leaf {i}: {a.dtype}{a.shape} vs the reference's {e.dtype}{e.shape}")
    assert e.tobytes() == a.tobytes(), f"{what}, leaf {i}: values differ from the reference"


def _smoke_shard_map() -> str:
  import shard_map_impl  # pylint: disable=import-outside-toplevel  # may stop at import

  if hasattr(jax, "shard_map"):
    name, reference = "jax.shard_map", jax.shard_map
  else:
    from jax.experimental.shard_map import shard_map as reference  # pylint: disable=import-outside-toplevel
    name = "jax.experimental.shard_map.shard_map"
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
  a = np.arange(8 * 6, dtype=np.float32).reshape(8, 6) / 7
  b = np.linspace(-2, 2, 2 * 6, dtype=np.float32).reshape(2, 6)

  def body(a, b):
    s = jax.lax.psum(jnp.sin(a) * b, "x")
    g = jax.lax.all_gather(b, "y", tiled=True)
    return s, jnp.tanh(g).sum(axis=1, keepdims=True) + jax.lax.axis_index("y")

  def program(shard_map: Callable[..., Any]) -> Any:
    f = shard_map(body, mesh=mesh, in_specs=(P("x", "y"), P(None, "y")),
                  out_specs=(P(None, "y"), P("y")))
    loss = lambda a, b: sum(jnp.sum(o * o) for o in f(a, b))  # noqa: E731
    return jax.jit(f)(a, b), jax.jit(jax.grad(loss))(a, b)

  _assert_same(program(reference), program(shard_map_impl.shard_map), f"shard_map vs {name}")
  return name


def _smoke_pmap() -> dict[str, str]:
  import pmap_compat  # pylint: disable=import-outside-toplevel

  name, reference = reference_pmap()
  n = jax.local_device_count()
  x = np.arange(n * 3 * 4, dtype=np.float32).reshape(n, 3, 4) / 17
  w = np.linspace(-1, 1, 4 * 5, dtype=np.float32).reshape(4, 5)

  def step(x, w):
    y = jnp.tanh(x @ w)
    perm = [(i, (i + 1) % n) for i in range(n)]
    return {"mean": jax.lax.pmean(y, "i"), "index": jax.lax.axis_index("i") + y.sum(),
            "shifted": jax.lax.ppermute(y, "i", perm)}

  expected = reference(step, axis_name="i", in_axes=(0, None))(x, w)
  ours = pmap_compat.pmap(step, axis_name="i", in_axes=(0, None))
  first, steady = ours(x, w), ours(x, w)
  for label, got in (("first call", first), ("steady-state call", steady)):
    _assert_same(expected, got, f"pmap_compat.pmap vs {name}, {label}")
    for e, a in zip(jax.tree.leaves(expected), jax.tree.leaves(got), strict=True):
      assert type(a.sharding) is type(e.sharding), (
          f"{label}: a {type(a.sharding).__name__} output where {name} gives a "
          f"{type(e.sharding).__name__}")
  return {"reference": name, "sharding": type(jax.tree.leaves(first)[0].sharding).__name__}


def _smoke_codemod(converted_root: str) -> str:

  target = "jax" if hasattr(jax, "shard_map") else "experimental"
  name, _ = reference_pmap()

  def load(path: str, label: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"smoke_{label}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

  with legacy_on():
    original = load(CODEMOD_PROGRAM, "original")  # its jax.pmap is built at import
  expected = original.run()
  folder = os.path.join(converted_root, target)
  sys.path.insert(0, folder)  # the support module the codemod writes beside its output
  converted = load(os.path.join(folder, os.path.basename(CODEMOD_PROGRAM)), f"converted_{target}")
  _assert_same(expected, converted.run(), f"codemod --target {target} output vs {name}")
  return target


def smoke(converted_root: str) -> dict[str, Any]:
  """The release's smoke; raises on the first disagreement."""
  report: dict[str, Any] = {"jax": jax.__version__, "legacy_pmap": has_legacy_pmap()}
  try:
    import shard_map_impl  # noqa: F401  # pylint: disable=import-outside-toplevel
    import pmap_compat  # noqa: F401  # pylint: disable=import-outside-toplevel
  except ImportError as err:
    report["stopped_at_import"] = str(err)
  else:
    report["shard_map"] = _smoke_shard_map()
    report["pmap"] = _smoke_pmap()
  report["codemod"] = _smoke_codemod(converted_root)
  return report


if __name__ == "__main__":
  print(json.dumps(smoke(sys.argv[1])))
