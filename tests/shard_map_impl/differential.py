"""Comparing one catalog case between JAX's shard_map and ours."""
from __future__ import annotations

import jax
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
