"""Unreduced/reduced axes in specs (jax 0.10's partial-sum types), differentially
against ``jax.shard_map`` on 0.10.2: where JAX rejects such specs (partially
manual, or axes not Explicit) ours raises the same exception with the same
message; where JAX accepts them ours refuses by name (not staged yet)."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, PartitionSpec as P

import shard_map_impl

pytestmark = pytest.mark.jax010_only(reason="PartitionSpec has unreduced axes from 0.10")

X = np.arange(32.0, dtype=np.float32).reshape(8, 4)


def _mesh(*types: AxisType) -> jax.sharding.Mesh:
  return jax.make_mesh((4, 2), ("x", "y"), axis_types=types)


EXPLICIT = (AxisType.Explicit, AxisType.Explicit)
AUTO = (AxisType.Auto, AxisType.Auto)
MIXED = (AxisType.Explicit, AxisType.Auto)

def _rejected() -> dict[str, tuple]:
  """(axis types, axis_names, in_specs, out_specs): each one JAX rejects.  Built per
  test: jax 0.6's PartitionSpec (the module is collected there too) has no such axes."""
  return {
      "out_unreduced_partial_manual": (EXPLICIT, {"x"}, P("x"), P(None, unreduced={"x"})),
      "in_reduced_partial_manual": (EXPLICIT, {"y"}, P(None, reduced={"y"}), P()),
      "out_unreduced_auto_axis": (AUTO, frozenset(), P("x"), P(unreduced={"y"})),
      "out_reduced_auto_axis": (AUTO, frozenset(), P("x"), P(reduced={"x"})),
      "in_unreduced_auto_axis": (AUTO, frozenset(), P(unreduced={"x"}), P()),
      "unreduced_on_the_auto_axis_of_a_mixed_mesh": (MIXED, frozenset(), P("x"),
                                                     P(unreduced={"y"})),
      "reduced_checked_after_unreduced": (MIXED, frozenset(), P("x"),
                                          P(unreduced={"x"}, reduced={"y"})),
      "in_specs_checked_before_out_specs": (AUTO, frozenset(), P(reduced={"x"}),
                                            P(unreduced={"y"})),
      "bad_leaf_reported_before_unreduced": (AUTO, frozenset(), (P("x"), 3),
                                             P(unreduced={"y"})),
  }


def _raised(sm: Callable, types: tuple, axis_names: Any, in_specs: Any, out_specs: Any
            ) -> BaseException:
  mesh = _mesh(*types)
  args = (X, X) if isinstance(in_specs, tuple) else (X,)
  try:
    jax.jit(sm(lambda *a: a[0], mesh=mesh, in_specs=in_specs, out_specs=out_specs,
               axis_names=axis_names))(*args)
  except Exception as e:  # noqa: BLE001  (the comparison is the test)
    return e
  raise AssertionError(f"{sm} accepted {in_specs} -> {out_specs}")


CASE_NAMES = ("out_unreduced_partial_manual", "in_reduced_partial_manual",
              "out_unreduced_auto_axis", "out_reduced_auto_axis", "in_unreduced_auto_axis",
              "unreduced_on_the_auto_axis_of_a_mixed_mesh", "reduced_checked_after_unreduced",
              "in_specs_checked_before_out_specs", "bad_leaf_reported_before_unreduced")


@pytest.mark.parametrize("case", CASE_NAMES)
def test_rejection_agrees_with_jax(case):
  program = _rejected()[case]
  want = _raised(jax.shard_map, *program)
  got = _raised(shard_map_impl.shard_map, *program)
  assert type(got) is type(want)
  assert str(got) == str(want)


@pytest.mark.parametrize("kind", ["in", "out"])
def test_accepted_by_jax_refused_by_name(kind):
  """Fully manual over Explicit axes: JAX stages it; ours says it does not."""
  mesh = _mesh(*EXPLICIT)
  in_specs, out_specs = ((P(None, reduced={"x"}), P()) if kind == "in"
                         else (P("x"), P(None, unreduced={"y"})))
  jax.shard_map(lambda a: a, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
  with pytest.raises(NotImplementedError, match=f"unreduced/reduced axes in {kind}_specs"):
    shard_map_impl.shard_map(lambda a: a, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
