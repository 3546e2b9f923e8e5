"""Bad inputs: ours raises the same exception type as JAX's shard_map, with a
message naming the same argument (and the same pytree paths into it)."""
from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import shard_map_impl
from reference import jax_shard_map
from support.jax_lines import requires
from support.meshes import make_mesh

lax = jax.lax
ARG_WORDS = ("in_specs", "out_specs", "auto", "mesh", "callable", "args")
PATH = re.compile(r"\b(in_specs|out_specs|args)((?:\[[^\]]*\])+)")


def _mentions(msg: str) -> tuple[set, set]:
  words = {w for w in ARG_WORDS if re.search(rf"\b{w}\b", msg)}
  return words, set(PATH.findall(msg))


def _raise(build, sm):
  with pytest.raises(Exception) as info:
    fun, args = build(sm)
    jax.block_until_ready(fun(*args))
  return info.value


def f_two(x, y):
  return x + y


def f_var(*xs):
  return xs[0]


MESH = lambda: make_mesh((4, 2))

ERRORS = {
    "f_not_callable": lambda sm: (sm(3, MESH(), P(), P()), ()),
    "mesh_wrong_type": lambda sm: (sm(jnp.sin, ("x",), P(), P()), ()),
    "auto_not_subset": lambda sm: (sm(jnp.sin, MESH(), P(), P(), auto=frozenset({"q"})), ()),
    "in_specs_none": lambda sm: (sm(jnp.sin, MESH(), None, P()), ()),
    "in_specs_leaf_not_pspec": lambda sm: (sm(jnp.sin, MESH(), ("x",), P()), ()),
    "in_specs_nested_bad_leaf": lambda sm: (sm(f_two, MESH(), (P("x"), [3]), P()), ()),
    "out_specs_leaf_not_pspec": lambda sm: (sm(jnp.sin, MESH(), P(), "x"), ()),
    "in_specs_refers_to_auto": lambda sm: (
        sm(jnp.sin, MESH(), P("y"), P(), auto=frozenset({"y"})), ()),
    "out_specs_refers_to_auto": lambda sm: (
        sm(jnp.sin, MESH(), P(), (P(), P("y")), auto=frozenset({"y"})), ()),
    "in_rank_too_small": lambda sm: (
        sm(f_two, MESH(), (P("x"), P(None, "y")), P("x")), (np.ones(8), np.ones(4))),
    "in_rank_scalar": lambda sm: (sm(jnp.sin, MESH(), P("x"), P()), (np.float32(1),)),
    "in_rank_varargs": lambda sm: (
        sm(f_var, MESH(), P("x", "y"), P()), (np.ones((8, 2)), np.ones(8))),
    "in_not_divisible": lambda sm: (
        sm(f_two, MESH(), (P("x"), P("y")), P("x")), (np.ones(8), np.ones(3))),
    "in_not_divisible_multi_axis": lambda sm: (
        sm(jnp.sin, MESH(), P(("x", "y")), P(("x", "y"))), (np.ones(12),)),
    "in_specs_tree_mismatch": lambda sm: (
        sm(f_two, MESH(), (P(), P(), P()), P()), (np.ones(4), np.ones(4))),
    "out_specs_tree_mismatch": lambda sm: (
        sm(lambda x: (x, x), MESH(), P(), (P(), P(), P())), (np.ones(4),)),
    "out_rank_too_small": lambda sm: (
        sm(lambda x: x.sum(), MESH(), P("x"), P("x")), (np.ones(8),)),
    "out_rank_second_output": lambda sm: (
        sm(lambda x: (x, x[0]), MESH(), P("x"), (P("x"), P("x"))), (np.ones(8),)),
    "out_not_replicated": lambda sm: (
        sm(lambda x: x * 2, MESH(), P("x"), P()), (np.ones(8),)),
    "out_not_replicated_one_axis": lambda sm: (
        sm(lambda x: lax.psum(x, "x"), MESH(), P("x", "y"), P()), (np.ones((8, 2)),)),
    "out_not_replicated_in_dict": lambda sm: (
        sm(lambda x: {"a": x, "b": lax.psum(x, "x")}, MESH(), P("x"),
           {"a": P(), "b": P()}), (np.ones(8),)),
    "collective_unbound_axis": lambda sm: (
        sm(lambda x: lax.psum(x, "w"), MESH(), P("x"), P()), (np.ones(8),)),
    "device_put_explicit_device": lambda sm: (
        sm(lambda x: jax.device_put(x, jax.devices()[1]), MESH(), P("x"), P("x")),
        (np.ones(8),)),
}


# Under jit, JAX accepts an explicit device in device_put inside the body.
EAGER_ONLY = {"device_put_explicit_device"}
# auto= naming an axis outside the mesh has no jax.shard_map (axis_names) spelling.
LEGACY_FORM_ONLY = {"auto_not_subset"}
CASES = [pytest.param(n, m, marks=[requires(
             "experimental_shard_map", "auto= outside the mesh has no jax.shard_map spelling")]
             if n in LEGACY_FORM_ONLY else [])
         for n in sorted(ERRORS) for m in ("eager", "jit")
         if not (m == "jit" and n in EAGER_ONLY)]


@pytest.mark.parametrize("name,mode", CASES)
def test_same_error_as_jax(name, mode):
  build = ERRORS[name]
  if mode == "jit":
    build = (lambda b: lambda sm: (lambda fa: (jax.jit(fa[0]), fa[1]))(b(sm)))(build)
  ref = _raise(build, jax_shard_map)
  ours = _raise(build, shard_map_impl.shard_map)
  assert isinstance(ours, type(ref)), (
      f"JAX raised {type(ref).__name__}: {ref}\nours raised {type(ours).__name__}: {ours}")
  ref_words, ref_paths = _mentions(str(ref))
  our_words, our_paths = _mentions(str(ours))
  assert ref_words <= our_words, f"JAX's message names {ref_words}: {ref}\nours: {ours}"
  # JAX 0.10's eager replication errors lose the paths (and name its own helper).
  assert ref_paths <= our_paths, f"JAX's message names {ref_paths}: {ref}\nours: {ours}"


def test_rank0_output_hint_like_jax():
  build = ERRORS["out_rank_too_small"]
  hint = "rank 0 outputs which are not constant over the mesh"
  assert hint in str(_raise(build, jax_shard_map))
  assert hint in str(_raise(build, shard_map_impl.shard_map))


@requires("experimental_shard_map", "jax.shard_map reads in_specs=None as no argument mapped")
def test_in_specs_none_suggests_p():
  build = ERRORS["in_specs_none"]
  for sm in (jax_shard_map, shard_map_impl.shard_map):
    assert "in_specs=P()" in str(_raise(build, sm))
