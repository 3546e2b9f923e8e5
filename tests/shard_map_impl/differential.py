"""Comparing one catalog case between JAX's shard_map and ours."""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

from support.compare import assert_trees_equal

import shard_map_impl
from catalog import Case, run_case
from reference import jax_shard_map, settings


def _assert_same_shardings(expected, actual) -> None:
  for e, a in zip(jax.tree.leaves(expected), jax.tree.leaves(actual), strict=True):
    es, as_ = getattr(e, "sharding", None), getattr(a, "sharding", None)
    if isinstance(es, NamedSharding) and isinstance(as_, NamedSharding):
      assert es.is_equivalent_to(as_, e.ndim), (
          f"output sharding {as_} differs from JAX's {es}")


def compare_case(c: Case, mesh, mode: str, *, shardy: bool = False, vma: bool = True):
  with settings(shardy, vma):
    ref_kind, ref = run_case(c, jax_shard_map, mesh, mode)
    our_kind, ours = run_case(c, shard_map_impl.shard_map, mesh, mode)
  if ref_kind == "err":
    assert our_kind == "err", (
        f"JAX's shard_map raised {type(ref).__name__}: {ref}\nours returned {ours!r}")
    assert isinstance(ours, type(ref)), (
        f"JAX's shard_map raised {type(ref).__name__}: {ref}\n"
        f"ours raised {type(ours).__name__}: {ours}")
    return ref
  if our_kind == "err":
    raise AssertionError(f"JAX's shard_map returned a value; ours raised "
                         f"{type(ours).__name__}: {ours}") from ours
  assert_trees_equal(ref, ours)
  _assert_same_shardings(ref, ours)
  return None


_FUNCTION_NAME = re.compile(r"applied to the function '[^']*'")


def assert_same_observations(want: dict[str, Any], got: dict[str, Any], *, eager: bool) -> None:
  """Two runs' observations (``values`` compared bit for bit, everything else with
  ``==``; an ``error`` as (type, message)).  JAX's eager shard_map names the function
  it wraps the body in, not the user's, in its messages: eager errors are compared
  with the function name left out."""
  assert set(got) == set(want), (
      f"JAX: {want.get('error') or 'ran'}\nours: {got.get('error') or 'ran'}")
  for key, expected in want.items():
    actual = got[key]
    if key == "values":
      assert len(actual) == len(expected)
      for e, g in zip(expected, actual, strict=True):
        np.testing.assert_array_equal(g, e, strict=True)
      continue
    if key == "error" and eager:
      expected = (expected[0], _FUNCTION_NAME.sub("", expected[1]))
      actual = (actual[0], _FUNCTION_NAME.sub("", actual[1]))
    assert actual == expected, f"{key} differs:\nJAX:  {expected}\nours: {actual}"


def observe(build: Callable[[], tuple[Callable, tuple]], *, jit: bool) -> dict[str, Any]:
  """Everything observable about running the program ``build()`` returns (its function
  and arguments; built inside, so construction errors count): under jit the printed
  jaxpr and StableHLO too; per result its avals, shardings and each device's values
  (an unreduced result has no global value, only each device's part); or the error."""
  seen: dict[str, Any] = {}
  try:
    fn, args = build()
    if jit:
      fn = jax.jit(fn)
      seen["jaxpr"] = str(jax.make_jaxpr(fn)(*args))
      seen["stablehlo"] = fn.lower(*args).as_text()
    result = fn(*args)
  except Exception as e:  # noqa: BLE001  (the comparison is the test)
    seen["error"] = (type(e), str(e))
    return seen
  leaves = jax.tree.leaves(result)
  seen["values"] = [np.asarray(s.data) for l in leaves
                    for s in sorted(l.addressable_shards, key=lambda s: s.device.id)]
  seen["avals"] = [jax.typeof(l).str_short(True) for l in leaves]
  seen["shardings"] = [l.sharding for l in leaves]
  return seen
