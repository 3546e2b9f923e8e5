"""axis_size, devices, backend, static_broadcasted_argnums, donate_argnums, global_arg_shapes
(rows 8-14)."""

import jax
import numpy as np
import pytest
from jax import lax

from legacy_messages import same_message
from pmap_compat import pmap
from support.compare import assert_trees_equal, compare_call, compare_with_legacy
from support.jax_lines import has
from support.legacy_pmap import has_legacy_pmap, legacy_reference


def arr(*shape):
  return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + 1


def psum_index(x):
  return lax.psum(x, "i") + lax.axis_index("i")


def test_axis_size_matching_is_accepted():
  compare_call(psum_index, (arr(8, 2),), pmap, axis_name="i", axis_size=8)


def test_axis_size_mismatch_raises_like_legacy():
  out = compare_call(psum_index, (arr(8, 2),), pmap, axis_name="i", axis_size=4)
  assert "Specified axis_size 4 doesn't match received axis_size 8" in str(out.error)


def test_all_in_axes_none_with_axis_size_maps_broadcast_inputs():
  # Legacy rejects this; we run axis_size copies (reference: vmap with axis_size).
  f = lambda x: x * 2 + lax.axis_index("i")  # noqa: E731
  ours = pmap(f, "i", in_axes=None, axis_size=4)(arr(3))
  assert_trees_equal(jax.vmap(f, in_axes=None, axis_size=4, axis_name="i")(arr(3)), ours)


def test_all_in_axes_none_without_axis_size_raises_like_legacy():
  compare_call(lambda x: x, (arr(3),), pmap, in_axes=None)


@pytest.mark.parametrize("picks", [[0, 1, 2, 3], [7, 6, 5, 4], [3, 5, 0, 6]], ids=str)
def test_devices_subset_and_order(picks):
  devs = [jax.devices()[i] for i in picks]
  compare_call(lambda x: (lax.psum(x, "i"), lax.ppermute(x, "i", [(0, 1), (1, 2)]),
                          lax.axis_index("i")), (arr(4, 2),), pmap, axis_name="i", devices=devs)
  out = pmap(lambda x: x, "i", devices=devs)(arr(4, 2))
  assert [s.device.id for s in sorted(out.addressable_shards, key=lambda s: s.index[0].start)] == picks


def test_devices_wrong_size_has_legacy_message():
  out = compare_call(lambda x: x, (arr(8, 2),), pmap, devices=jax.devices()[:4])
  assert "must equal the number of local devices passed to pmap" in str(out.error)
  with pytest.raises(ValueError, match=r"Got axis_size=8, num_local_devices=4"):
    pmap(lambda x: x, devices=jax.devices()[:4])(arr(8, 2))


def test_duplicate_devices_raise_clear_error():
  with pytest.raises(ValueError, match=f"same device more than once: {jax.devices()[0]}"):
    pmap(lambda x: x, devices=[jax.devices()[0]] * 2)


_LEGACY_ONLY = pytest.mark.skipif(
    not has_legacy_pmap(), reason="where legacy pmap is gone, pmap_compat rejects an empty "
    "device list when applied, as that release's own jax.pmap does (test below)")


@_LEGACY_ONLY
def test_empty_devices_accepted_when_applied_like_legacy():
  legacy = compare_with_legacy(lambda pm: callable(pm(lambda x: x, devices=[])), pmap)
  assert legacy.value is True


@pytest.mark.skipif(has_legacy_pmap(), reason="legacy rejects it when called (tests above)")
def test_empty_devices_rejected_when_applied_like_the_releases_pmap():
  with pytest.raises(ValueError) as theirs:
    jax.pmap(lambda x: x, devices=[])
  with pytest.raises(ValueError) as ours:
    pmap(lambda x: x, devices=[])
  assert str(ours.value) == str(theirs.value)


@_LEGACY_ONLY
@pytest.mark.parametrize("use", ["call", "lower", "trace", "nested"])
def test_empty_devices_raise_when_called_like_legacy(use):
  def program(pm):
    f = pm(lambda x: x * 2, devices=[])
    if use == "nested":
      return pm(f)(arr(2, 4))
    return f(arr(1, 2)) if use == "call" else getattr(f, use)(arr(1, 2))
  same_message(program)


def test_backend_cpu():
  compare_call(psum_index, (arr(8, 3),), pmap, axis_name="i", backend="cpu")


def test_static_broadcasted_argnums():
  def f(x, n, mode):
    return x * n if mode == "mul" else x + n
  def program(pm):
    g = pm(f, static_broadcasted_argnums=(1, 2))
    return g(arr(8, 2), 3, "mul"), g(arr(8, 2), 4, "add"), g(arr(8, 2), 3, "mul")
  compare_with_legacy(program, pmap)


def test_static_broadcasted_argnums_negative_and_int():
  compare_with_legacy(lambda pm: pm(lambda x, n: x ** n, static_broadcasted_argnums=-1)(arr(8), 2),
                      pmap)
  compare_with_legacy(lambda pm: pm(lambda n, x: x * n, static_broadcasted_argnums=0)(5, arr(8)),
                      pmap)


def test_static_with_in_axes_tuple_over_all_args():
  compare_with_legacy(lambda pm: pm(lambda x, n, y: x * n + y, in_axes=(0, None, 1),
                                    static_broadcasted_argnums=1)(arr(8, 2), 3, arr(2, 8)), pmap)


def test_unhashable_static_raises_like_legacy():
  out = compare_call(lambda x, s: x, (arr(8), np.ones(3)), pmap, static_broadcasted_argnums=1)
  assert "Non-hashable static arguments" in str(out.error)


def test_static_argument_passed_by_keyword_or_missing():
  compare_with_legacy(lambda pm: pm(lambda x, n: x * n, static_broadcasted_argnums=1)(arr(8)), pmap)


def test_static_lower_works():
  f = pmap(lambda x, n: x * n, static_broadcasted_argnums=1)
  compiled = f.lower(arr(8), 3).compile()
  assert_trees_equal(jax.pmap(lambda x, n: x * n, static_broadcasted_argnums=1)(arr(8), 3),
                     compiled(arr(8)))


@pytest.mark.parametrize("impl", ["legacy", "ours"])
def test_donate_argnums_deletes_input(impl):
  pm = jax.pmap if impl == "legacy" else pmap
  f = pm(lambda x, y: x * 2 + y, donate_argnums=0)
  x = pm(lambda v: v)(arr(8, 4))   # a well-placed input
  y = pm(lambda v: v)(arr(8, 4))
  out = f(x, y)
  assert x.is_deleted() and not y.is_deleted()
  np.testing.assert_array_equal(np.asarray(out), arr(8, 4) * 3)


def test_donate_matches_legacy_values():
  def program(pm):
    f = pm(lambda x, n, y: (x * n, y + 1), static_broadcasted_argnums=1, donate_argnums=(0, 2))
    x = pm(lambda v: v)(arr(8, 3))
    y = pm(lambda v: v * 2)(arr(8, 3))
    return f(x, 3, y), x.is_deleted(), y.is_deleted()
  compare_with_legacy(program, pmap)


def test_global_arg_shapes_raises_like_legacy():
  # jax 0.10's jax.pmap no longer takes the argument at all (TypeError).
  for pm in (legacy_reference(), pmap) if has("legacy_pmap") else (pmap,):
    with pytest.raises(ValueError, match="global_arg_shapes only worked with sharded_jit"):
      pm(lambda x: x, global_arg_shapes=((8,),))


def test_bad_in_axes_type_raises_like_legacy():
  for pm in (jax.pmap, pmap):
    with pytest.raises(TypeError, match=r"pmap in_axes must be an int, None, or \(nested\)"):
      pm(lambda x: x, in_axes=1.0)
    with pytest.raises(TypeError, match="pmap out_axes must be an int"):
      pm(lambda x: x, out_axes="a")
