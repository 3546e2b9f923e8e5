"""``shard_map_impl.smap`` differentially against the release's ``jax.smap``: values
bit for bit, output shardings, printed jaxprs and StableHLO under jit, eager
results, and the same errors (type and message) where ``jax.smap`` rejects."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import shard_map_impl
from differential import assert_same_observations, observe
from reference import use_mesh
from support.jax_lines import requires

pytestmark = requires("smap")

lax = jax.lax
X = np.arange(32.0, dtype=np.float32).reshape(8, 4)
Y = np.arange(16.0, dtype=np.float32).reshape(4, 4) + 0.5


def _mesh(kind: AxisType) -> jax.sharding.Mesh:
  return jax.make_mesh((4, 2), ("x", "y"), axis_types=(kind, kind))


def _args(mesh: jax.sharding.Mesh, explicit: bool) -> tuple:
  if not explicit:
    return X, Y
  return (jax.device_put(X, NamedSharding(mesh, P("x"))),
          jax.device_put(Y, NamedSharding(mesh, P())))


# name -> (mesh axis type, smap keyword arguments, body)
def _programs() -> dict[str, tuple[AxisType, dict, Callable]]:
  return {
      "psum_rows": (AxisType.Auto, dict(in_axes=(0, None), out_axes=None, axis_name="x"),
                    lambda a, b: lax.psum(a.sum(0), "x") + b[0]),
      "rows_out_rows": (AxisType.Auto, dict(in_axes=(0, None), out_axes=0, axis_name="x"),
                        lambda a, b: a * 2 + b[0]),
      "columns_on_y": (AxisType.Auto, dict(in_axes=(1, None), out_axes=1, axis_name="y"),
                       lambda a, b: a + lax.axis_index("y")),
      "int_in_axes": (AxisType.Auto, dict(in_axes=0, out_axes=0, axis_name="x"),
                      lambda a, b: a - b),
      "out_axes_tree": (AxisType.Auto, dict(in_axes=(0, None), out_axes=(0, None),
                                            axis_name="x"),
                        lambda a, b: (a, lax.psum(a, "x").sum(0))),
      "inferred_in_axes": (AxisType.Explicit, dict(out_axes=0, axis_name="x"),
                           lambda a, b: a * b.sum()),
      "all_gather": (AxisType.Auto, dict(in_axes=(0, None), out_axes=None, axis_name="x"),
                     lambda a, b: lax.all_gather(a, "x", tiled=True)),
      # jax.smap rejects these:
      "inferred_on_auto_axes": (AxisType.Auto, dict(out_axes=0, axis_name="x"),
                                lambda a, b: a),
      "axis_not_in_mesh": (AxisType.Auto, dict(in_axes=0, out_axes=0, axis_name="z"),
                           lambda a, b: a),
      "unreplicated_out_axes_none": (AxisType.Auto, dict(in_axes=(0, None), out_axes=None,
                                                         axis_name="x"),
                                     lambda a, b: a),
  }


def _observe(smap: Callable, name: str, jit: bool) -> dict[str, Any]:
  kind, kwargs, body = _programs()[name]
  mesh = _mesh(kind)
  with use_mesh(mesh):
    return observe(lambda: (smap(body, **kwargs), _args(mesh, kind == AxisType.Explicit)),
                   jit=jit)


@pytest.mark.parametrize("jit", [True, False], ids=["jit", "eager"])
@pytest.mark.parametrize("name", list(_programs()))
def test_smap_agrees_with_jax(name, jit):
  want = _observe(jax.smap, name, jit)
  got = _observe(shard_map_impl.smap, name, jit)
  assert_same_observations(want, got, eager=not jit)


@pytest.mark.parametrize("kwargs", [
    dict(in_axes=0, out_axes=0, axis_name=("x",)),
    dict(in_axes=[0], out_axes=0, axis_name="x"),
    dict(in_axes=(0, "a"), out_axes=0, axis_name="x"),
    dict(in_axes=0, out_axes=(0, 1.5), axis_name="x"),
], ids=["axis_name_tuple", "in_axes_list", "in_axes_bad_leaf", "out_axes_bad_leaf"])
def test_bad_arguments_rejected_like_jax(kwargs):
  errors = []
  for smap in (jax.smap, shard_map_impl.smap):
    with pytest.raises(TypeError) as info:
      smap(lambda a: a, **kwargs)
    errors.append(str(info.value))
  assert errors[1] == errors[0]
