"""Conformance: collectives under pmap_compat vs legacy jax.pmap, in the style of JAX's pmap tests.

Covers reductions, gathers, permutations and all_to_all on various ranks/dtypes/axes,
axis_index_groups, mapped sizes below the device count, and collectives under nested
pmaps and under vmap-of-pmap / pmap-of-vmap (collectives over both names).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pmap_compat import pmap
from references import compare_call, compare_with_legacy


def arr(*shape, dtype=np.float32):
  return (np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) * 0.25 - 2).astype(dtype)


GROUPS = [[0, 1, 2, 3], [4, 5, 6, 7]]
GROUPS_PAIRS = [[0, 4], [1, 5], [2, 6], [3, 7]]

CASES = {
    "psum_scalar": (lambda x: lax.psum(x, "i"), (8,)),
    "psum_3d": (lambda x: lax.psum(x, "i"), (8, 2, 3)),
    "pmean_2d": (lambda x: lax.pmean(x, "i"), (8, 5)),
    "pmax_2d": (lambda x: lax.pmax(x, "i"), (8, 4)),
    "pmin_2d": (lambda x: lax.pmin(x, "i"), (8, 4)),
    "x_minus_mean": (lambda x: x - lax.pmean(x, "i"), (8, 3)),
    "normalise": (lambda x: x / lax.psum(jnp.abs(x) + 1, "i"), (8, 3)),
    "psum_of_tuple": (lambda x: lax.psum((x, 2 * x, x[0]), "i"), (8, 3)),
    "psum_python_const": (lambda x: x * lax.psum(2.0, "i"), (8, 2)),
    "all_gather_0": (lambda x: lax.all_gather(x, "i"), (8, 3)),
    "all_gather_scalar": (lambda x: lax.all_gather(x, "i"), (8,)),
    "all_gather_axis2": (lambda x: lax.all_gather(x, "i", axis=2), (8, 2, 3)),
    "all_gather_tiled_axis1": (lambda x: lax.all_gather(x, "i", axis=1, tiled=True), (8, 2, 3)),
    "ppermute_shift": (lambda x: lax.ppermute(x, "i", [(i, (i + 1) % 8) for i in range(8)]), (8, 3)),
    "ppermute_swap_pairs": (lambda x: lax.ppermute(x, "i", [(0, 1), (1, 0), (6, 7), (7, 6)]), (8, 2)),
    "ppermute_identity": (lambda x: lax.ppermute(x, "i", [(i, i) for i in range(8)]), (8, 2)),
    "pshuffle_reverse": (lambda x: lax.pshuffle(x, "i", list(reversed(range(8)))), (8, 2)),
    "pswapaxes_sq": (lambda x: lax.pswapaxes(x, "i", 0), (8, 8)),
    "pswapaxes_axis1": (lambda x: lax.pswapaxes(x, "i", 1), (8, 2, 8)),
    "all_to_all_0_1": (lambda x: lax.all_to_all(x, "i", 0, 1), (8, 8, 2)),
    "all_to_all_1_0": (lambda x: lax.all_to_all(x, "i", 1, 0), (8, 3, 8)),
    "all_to_all_tiled_1_1": (lambda x: lax.all_to_all(x, "i", 1, 1, tiled=True), (8, 2, 16)),
    "psum_scatter_0": (lambda x: lax.psum_scatter(x, "i", scatter_dimension=0), (8, 8, 3)),
    "psum_scatter_1": (lambda x: lax.psum_scatter(x, "i", scatter_dimension=1), (8, 2, 8)),
    "psum_scatter_tiled": (lambda x: lax.psum_scatter(x, "i", tiled=True), (8, 16)),
    "axis_index_plus": (lambda x: x + lax.axis_index("i").astype(x.dtype), (8, 2)),
    "axis_index_only": (lambda x: lax.axis_index("i"), (8,)),
    "psum_groups4": (lambda x: lax.psum(x, "i", axis_index_groups=GROUPS), (8, 2)),
    "psum_groups_pairs": (lambda x: lax.psum(x, "i", axis_index_groups=GROUPS_PAIRS), (8, 2)),
    "pmean_groups": (lambda x: lax.pmean(x, "i", axis_index_groups=GROUPS), (8, 2)),
    "pmin_groups": (lambda x: lax.pmin(x, "i", axis_index_groups=GROUPS_PAIRS), (8, 2)),
    "all_gather_groups_tiled": (
        lambda x: lax.all_gather(x, "i", axis_index_groups=GROUPS, tiled=True), (8, 2)),
    "psum_scatter_groups_tiled": (
        lambda x: lax.psum_scatter(x, "i", axis_index_groups=GROUPS, tiled=True), (8, 8)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_collective(name):
  fun, shape = CASES[name]
  compare_call(fun, (arr(*shape),), pmap, axis_name="i")


@pytest.mark.parametrize("dtype", [np.int32, np.bool_, np.complex64, jnp.bfloat16, np.float16, np.uint8],
                         ids=lambda d: np.dtype(d).name)


def test_collectives_on_dtypes(dtype):
  x = arr(8, 4).astype(dtype) if dtype is not np.bool_ else (arr(8, 4) > 0)

  def f(v):
    g = lax.all_gather(v, "i")
    p = lax.ppermute(v, "i", [(i, (i + 5) % 8) for i in range(8)])
    if v.dtype == np.bool_:
      return g, p
    return g, p, lax.psum(v, "i"), lax.pmax(v, "i") if v.dtype.kind != "c" else v
  compare_call(f, (x,), pmap, axis_name="i")


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_collectives_with_mapped_size_below_device_count(n):
  compare_call(lambda x: (lax.psum(x, "i"), lax.all_gather(x, "i"), lax.axis_index("i"),
                          lax.pshuffle(x, "i", list(reversed(range(n))))),
               (arr(n, 3),), pmap, axis_name="i")


def test_axis_index_groups_on_size_4():
  compare_call(lambda x: lax.psum(x, "i", axis_index_groups=[[0, 3], [1, 2]]),
               (arr(4, 2),), pmap, axis_name="i")


def test_collective_with_tuple_of_one_name():
  compare_call(lambda x: (lax.pmax(x, ("i",)), lax.all_gather(x, ("i",))), (arr(8, 2),), pmap,
               axis_name="i")


NESTED = {
    "psum_i": lambda x: lax.psum(x, "i"),
    "psum_j": lambda x: lax.psum(x, "j"),
    "psum_ij": lambda x: lax.psum(x, ("i", "j")),
    "pmax_ji": lambda x: lax.pmax(x, ("j", "i")),
    "pmean_ij": lambda x: lax.pmean(x, ("i", "j")),
    "axis_index_i_j": lambda x: x + 10 * lax.axis_index("i") + lax.axis_index("j"),
    "all_gather_j": lambda x: lax.all_gather(x, "j"),
    "all_gather_i": lambda x: lax.all_gather(x, "i"),
    "ppermute_j": lambda x: lax.ppermute(x, "j", [(0, 1), (1, 0)]),
    "ppermute_i": lambda x: lax.ppermute(x, "i", [(0, 1), (1, 2), (2, 3), (3, 0)]),
    "psum_size": lambda x: x * lax.psum(1, ("i", "j")),
}


@pytest.mark.parametrize("name", sorted(NESTED))
def test_nested_pmap_collectives(name):
  compare_with_legacy(lambda pm: pm(pm(NESTED[name], axis_name="j"), axis_name="i")(arr(4, 2, 3)),
                      pmap)


def test_nested_pmap_2x2x2_three_levels():
  f = lambda x: lax.psum(x, ("i", "k")) + lax.axis_index("j")
  compare_with_legacy(
      lambda pm: pm(pm(pm(f, axis_name="k"), axis_name="j"), axis_name="i")(arr(2, 2, 2, 3)), pmap)


def test_nested_pmap_inner_smaller():
  compare_with_legacy(
      lambda pm: pm(pm(lambda x: lax.psum(x, "j"), axis_name="j"), axis_name="i")(arr(2, 3, 2)),
      pmap)


def test_nested_pmap_outer_computation_around_inner():
  def program(pm):
    inner = pm(lambda v: lax.psum(v, "j") * 2, axis_name="j")
    return pm(lambda x: inner(x + 1) - lax.psum(x, "i"), axis_name="i")(arr(4, 2, 3))
  compare_with_legacy(program, pmap)


def test_vmap_of_pmap_collective_over_both():
  def program(pm):
    f = pm(lambda x: lax.psum(x, "i") + lax.psum(x, "v"), axis_name="i")
    return jax.vmap(f, axis_name="v")(arr(3, 8, 2))
  compare_with_legacy(program, pmap)


def test_pmap_of_vmap_collective_over_both():
  def program(pm):
    g = jax.vmap(lambda x: lax.pmax(x, "v") - lax.psum(x, ("i",)), axis_name="v")
    return pm(g, axis_name="i")(arr(8, 3, 2))
  compare_with_legacy(program, pmap)


def test_pmap_of_vmap_psum_over_tuple_of_both():
  def program(pm):
    g = jax.vmap(lambda x: lax.psum(x, ("i", "v")), axis_name="v")
    return pm(g, axis_name="i")(arr(8, 3))
  compare_with_legacy(program, pmap)


def test_vmap_of_pmap_with_in_axes_1():
  def program(pm):
    f = pm(lambda x: lax.all_gather(x, "i"), axis_name="i")
    return jax.vmap(f, in_axes=1)(arr(8, 3, 2))
  compare_with_legacy(program, pmap)


def test_pmap_of_vmap_axis_index():
  def program(pm):
    g = jax.vmap(lambda x: x * lax.axis_index("i"))
    return pm(g, axis_name="i")(arr(8, 3))
  compare_with_legacy(program, pmap)
