"""Row 16: pmaps of several sizes inside one user ``jit`` (legacy: an internal
AssertionError), and a pmap under ``jit`` fed arrays that live on fewer devices.

Under a user's jit a size-k pmap spreads over every device (an extra replicated mesh
axis), so pmaps of different sizes share the one device assignment a jit computation
has. The reference is the same program with ``vmap``. On jax 0.10.2 the computation may
not *return* results of two sizes whose layouts no single mesh describes: jax's jit then
fails to name the output shardings (its own ``jax.shard_map`` fails the same way); see
test_pmap_transforms.py::test_pmap_of_different_sizes_inside_one_jit.
"""
import jax
import numpy as np
import pytest
from jax import lax

from pmap_compat import pmap
from support.compare import assert_trees_equal, compare_with_jax_pmap
from support.jax_lines import has, requires

TOL = dict(rtol=1e-5, atol=1e-6)


def arr(*shape):
  return (np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) % 11 + 1) / 10


def _maps(pm):
  return (pm(lambda x: lax.psum(x, "i") * x, "i"), pm(lambda x: lax.pmax(x, "i") - x, "i"),
          pm(lambda x: x * lax.axis_index("i"), "i"))


PROGRAMS = {
    "reduced": lambda f8, f4, f2: lambda a, b, c: f8(a).sum() + f4(b).sum() * f2(c).sum(),
    "one_size_returned": lambda f8, f4, f2: lambda a, b, c: (f8(a), f4(b).sum() + f2(c).sum()),
    "small_sizes_returned": lambda f8, f4, f2: lambda a, b, c: (f4(b), f2(c), f8(a).max()),
    "gradient": lambda f8, f4, f2: jax.grad(lambda a, b, c: (f8(a) * f4(b).sum()).sum()),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_several_sizes_in_one_jit_match_vmap(name):
  def program(pm):
    return jax.jit(PROGRAMS[name](*_maps(pm)))(arr(8, 2), arr(4, 3), arr(2, 5))
  expected = program(lambda f, name: jax.vmap(f, axis_name=name))
  if name == "small_sizes_returned" and not has("jit_returns_shard_maps_of_sizes_4_and_2"):
    # Ours fails as the same program of JAX's own shard_maps does there.
    with pytest.raises(ValueError):
      program(pmap)
    return
  assert_trees_equal(expected, program(pmap), **TOL)


@requires("no_legacy_pmap", "the release's jax.pmap is the reference; with legacy pmap "
          "test_pmap_transforms.py compares with legacy")
@pytest.mark.parametrize("size", [2, 4, 8])
def test_results_of_a_smaller_pmap_feed_one_under_jit(size):
  # The input's aval names the k devices it lives on: the pmap under jit keeps to them.
  def program(pm):
    first = pm(lambda x: x + 1, "i")(arr(size, 3))
    return jax.jit(lambda x: pm(lambda v: lax.psum(v, "i") * 3 + v, "i")(x) - 1)(first)
  reference = compare_with_jax_pmap(program, pmap)
  assert reference.error is None, reference.error
