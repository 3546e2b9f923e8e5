"""Every collective, axis_index and axis_index_groups under pmap_compat vs legacy (row 15)."""

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from pmap_compat import pmap
from references import compare_call


def arr(*shape, dtype=np.float32):
  return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape) * 0.5 - 3


PERM = [(i, (i + 3) % 8) for i in range(8)]
GROUPS = [[0, 2, 4, 6], [1, 3, 5, 7]]

COLLECTIVES = {
    "psum": lambda x: lax.psum(x, "i"),
    "pmean": lambda x: lax.pmean(x, "i"),
    "pmax": lambda x: lax.pmax(x, "i"),
    "pmin": lambda x: lax.pmin(x, "i"),
    "psum_tree": lambda x: lax.psum({"a": x, "b": (x * 2,)}, "i"),
    "all_gather": lambda x: lax.all_gather(x, "i"),
    "all_gather_axis1": lambda x: lax.all_gather(x, "i", axis=1),
    "all_gather_tiled": lambda x: lax.all_gather(x, "i", tiled=True),
    "ppermute": lambda x: lax.ppermute(x, "i", PERM),
    "ppermute_partial": lambda x: lax.ppermute(x, "i", [(0, 1), (5, 2)]),
    "pshuffle": lambda x: lax.pshuffle(x, "i", [3, 1, 0, 2, 7, 6, 4, 5]),
    "pswapaxes": lambda x: lax.pswapaxes(x, "i", axis=0),
    "all_to_all": lambda x: lax.all_to_all(x, "i", 0, 0),
    "all_to_all_tiled": lambda x: lax.all_to_all(x, "i", 0, 1, tiled=True),
    "psum_scatter": lambda x: lax.psum_scatter(x, "i"),
    "psum_scatter_tiled": lambda x: lax.psum_scatter(x, "i", scatter_dimension=1, tiled=True),
    "axis_index": lambda x: x * lax.axis_index("i"),
    "axis_size": lambda x: x + lax.psum(1, "i"),
    "psum_groups": lambda x: lax.psum(x, "i", axis_index_groups=GROUPS),
    "pmax_groups": lambda x: lax.pmax(x, "i", axis_index_groups=GROUPS),
    "all_gather_groups": lambda x: lax.all_gather(x, "i", axis_index_groups=GROUPS),
    "psum_scatter_groups": lambda x: lax.psum_scatter(x, "i", axis_index_groups=[[0, 1], [2, 3], [4, 5], [6, 7]]),
    "all_to_all_groups": lambda x: lax.all_to_all(x, "i", 0, 0, axis_index_groups=GROUPS),
    "psum_int": lambda x: lax.psum(x.astype(jnp.int32), "i"),
}


@pytest.mark.parametrize("name", sorted(COLLECTIVES))
def test_collective_matches_legacy(name):
  compare_call(COLLECTIVES[name], (arr(8, 8, 8),), pmap, axis_name="i")


def test_collectives_with_axis_smaller_than_devices():
  compare_call(lambda x: (lax.psum(x, "i"), lax.all_gather(x, "i"), lax.ppermute(x, "i", [(0, 3)]),
                          lax.axis_index("i")), (arr(4, 3),), pmap, axis_name="i")


def test_collectives_on_tuple_axis_name_single_level():
  compare_call(lambda x: lax.psum(x, ("i",)), (arr(8, 2),), pmap, axis_name="i")


def test_unnamed_default_axis_computes_without_collectives():
  compare_call(lambda x: jnp.sin(x) * 2, (arr(8, 5),), pmap)
