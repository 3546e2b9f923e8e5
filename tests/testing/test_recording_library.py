"""pmap_compat.testing as a library, on jax 0.6.0 with legacy jax.pmap.

The reference for a recording is the program's own output (what legacy jax.pmap
returned); the reference for ulp distances is numpy.testing's own ulp check.
"""
import collections
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pmap_compat import testing
from pmap_compat.testing import comparison, recordings, trees

Point = collections.namedtuple("Point", ["x", "y"])


def _step(scale: float = 0.1):
  """A legacy-pmap program: psum/pmean, typed keys, mixed containers and leaf kinds."""
  n = jax.local_device_count()

  def body(x, key):
    key, sub = jax.random.split(key)
    noise = jax.random.normal(sub, x.shape)
    total = jax.lax.psum(x * scale, "i")
    return {"total": total, "mean": jax.lax.pmean(x + noise, "i"), "key": key,
            "count": jax.lax.psum(jnp.int32(1), "i")}

  x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
  out = jax.pmap(body, axis_name="i")(x, jax.random.split(jax.random.key(0), n))
  return {"out": out, "point": Point(out["total"][0], np.float64(2.5)), "none": None,
          "steps": [3, 1.5, True], "name": "dp", "bf16": jnp.ones((2,), jnp.bfloat16),
          "rbg": jax.random.key(1, impl="rbg")}


def _leaves_by_path(tree):
  return {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_round_trip_on_legacy_pmap_is_bit_for_bit(tmp_path):
  recording = testing.record(_step, tmp_path / "rec")
  assert recording.producer["pmap"] == "legacy jax.pmap"
  assert recording.producer["jax"] == jax.__version__
  report = testing.check(_step, tmp_path / "rec")
  assert report.ok and report.tolerance.exact, str(report)
  assert {l.status for l in report.leaves} == {"identical"}
  assert "worst leaf: none, every leaf is identical" in str(report)


def test_loaded_leaves_equal_what_the_program_returned(tmp_path):
  outputs = _step()
  testing.record(outputs, tmp_path / "rec")
  loaded = testing.load(tmp_path / "rec")
  want = _leaves_by_path(outputs)
  assert [l.path for l in loaded.leaves] == list(want)
  for leaf in loaded.leaves:
    x = want[leaf.path]
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      key = jax.random.wrap_key_data(leaf.value, impl=leaf.key_impl)
      assert key.dtype == x.dtype and key.shape == x.shape
      np.testing.assert_array_equal(jax.random.key_data(key), jax.random.key_data(x))
    elif isinstance(x, str):
      assert leaf.value == x
    else:
      assert leaf.value.dtype == np.asarray(x).dtype
      assert leaf.shape == leaf.value.shape == np.shape(x)
      assert leaf.value.tobytes() == np.asarray(x).tobytes()


@jax.tree_util.register_pytree_with_keys_class
class Registered:
  """A pytree node registered with JAX, as Flax structs and optimizer states are."""

  def __init__(self, a, b):
    self.a, self.b = a, b

  def tree_flatten_with_keys(self):
    return [(jax.tree_util.GetAttrKey("b"), self.b), (jax.tree_util.GetAttrKey("a"), self.a)], None

  @classmethod
  def tree_unflatten(cls, _, children):
    return cls(children[1], children[0])


def test_leaf_paths_and_order_are_jax_own():
  tree = {"b": collections.OrderedDict([("z", 1), ("a", 2)]), "a": (np.zeros(1), [3, None]),
          "d": collections.defaultdict(int, {"y": 1, "x": 2}), "p": Point(4, 5),
          "r": Registered(6, {"k": 7})}
  structure, leaves = trees.describe(tree)
  want = jax.tree_util.tree_flatten_with_path(tree)[0]
  assert [p for p, _ in leaves] == [jax.tree_util.keystr(p) for p, _ in want]
  assert [x for _, x in leaves] == [x for _, x in want]
  assert structure["type"] == "dict"


def test_the_format_is_plain_json_and_npy(tmp_path):
  testing.record(_step, tmp_path / "rec")
  manifest = json.loads((tmp_path / "rec" / "manifest.json").read_text())
  assert manifest["format"] == "pmap_compat.testing/1"
  by_path = {e["path"]: e for e in manifest["leaves"]}
  assert by_path["['out']['key']"]["key_impl"] == "threefry2x32"
  assert by_path["['rbg']"]["key_impl"] == "rbg"
  assert by_path["['bf16']"]["stored_as"] == "uint16"
  for entry in manifest["leaves"]:
    if "file" in entry:  # readable by numpy alone, without pickles
      np.load(tmp_path / "rec" / entry["file"], allow_pickle=False)
  assert manifest["tree"]["keys"] == sorted(_step())


def test_a_perturbed_program_fails_naming_the_leaf(tmp_path):
  testing.record(_step, tmp_path / "rec")
  report = testing.check(lambda: _step(scale=0.10000001), tmp_path / "rec")
  assert not report.ok
  failing = [l.path for l in report.failures]
  assert failing == ["['out']['total']", "['point'].x"]
  assert report.worst.path == "['out']['total']"
  text = str(report)
  assert "['out']['total']" in text and "BEYOND TOLERANCE" in text and "max ulp" in text
  assert "FAIL" in text.splitlines()[-1]


def test_assert_matches_recording_raises_with_the_report(tmp_path):
  testing.record(_step, tmp_path / "rec", kwargs={"scale": 0.5})
  testing.assert_matches_recording(_step, tmp_path / "rec", scale=0.5)
  with pytest.raises(AssertionError, match=r"\['out'\]\['total'\].*BEYOND TOLERANCE"):
    testing.assert_matches_recording(_step, tmp_path / "rec", scale=0.25)


def test_wrong_tree_structure_is_named(tmp_path):
  testing.record({"params": {"w": np.zeros(3), "b": np.ones(2)}, "loss": np.float32(1)},
                 tmp_path / "rec")
  report = testing.check({"params": {"w": np.zeros(3)}, "loss": np.float32(1)}, tmp_path / "rec")
  assert not report.ok
  assert report.structure == [
      "tree structure differs at ['params']: recorded a dict with keys ['b', 'w'], "
      "got a dict with keys ['w']"]
  assert [(l.path, l.status) for l in report.leaves if not l.ok] == [("['params']['b']", "missing")]
  report = testing.check([np.zeros(3)], tmp_path / "rec")
  assert "recorded a dict with keys ['loss', 'params'], got a list of length 1" in str(report)


@pytest.mark.parametrize("actual,detail", [
    (np.zeros((2, 3), np.float64), "dtype differs: recorded float32, got float64"),
    (np.zeros((3, 2), np.float32), "shape differs: recorded (2, 3), got (3, 2)"),
    (jnp.zeros((2, 3), np.float32), "type differs: recorded numpy.ndarray, got jax.Array"),
])
def test_wrong_dtype_shape_or_type_is_named(tmp_path, actual, detail):
  testing.record({"w": np.zeros((2, 3), np.float32)}, tmp_path / "rec")
  report = testing.check({"w": actual}, tmp_path / "rec")
  [leaf] = report.leaves
  assert leaf.status == "mismatch" and leaf.detail == detail
  assert "['w']" in str(report) and detail in str(report)


def test_typed_keys_must_match_exactly_and_by_impl(tmp_path):
  keys = jax.random.split(jax.random.key(0), 8)
  testing.record({"k": keys}, tmp_path / "rec")
  assert testing.check({"k": keys}, tmp_path / "rec").ok
  other = testing.check({"k": jax.random.split(jax.random.key(1), 8)}, tmp_path / "rec",
                        max_ulp=10**9)  # no tolerance applies to key bits
  assert [l.status for l in other.leaves] == ["beyond"]
  rbg = testing.check({"k": jax.random.split(jax.random.key(0, impl="rbg"), 8)}, tmp_path / "rec")
  assert not rbg.ok and rbg.leaves[0].status == "mismatch"


def _ulps_apart(x: np.ndarray, k: int) -> np.ndarray:
  y = x.copy()
  for _ in range(k):
    y = np.nextafter(y, np.inf, dtype=x.dtype)
  return y


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 3])
def test_ulp_distance_agrees_with_numpy_testing(dtype, k):
  x = np.array([-2.5, -1e-3, 0.0, 1e-30, 1.0, 3e4], dtype)
  y = _ulps_apart(x, k)
  np.testing.assert_array_max_ulp(x, y, maxulp=k, dtype=dtype)
  assert int(comparison.ulp_distance(x, y).max()) == k
  with pytest.raises(AssertionError):
    np.testing.assert_array_max_ulp(x, y, maxulp=k - 1, dtype=dtype)


def _allclose_passes(actual, desired, rtol, atol) -> bool:
  try:
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol)
  except AssertionError:
    return False
  return True


def test_tolerances(tmp_path):
  x = np.linspace(1, 2, 16, dtype=np.float32)
  testing.record({"x": x}, tmp_path / "rec")
  two_ulp = _ulps_apart(x, 2)
  assert not testing.check({"x": two_ulp}, tmp_path / "rec").ok  # same jax: bit for bit
  assert not testing.check({"x": two_ulp}, tmp_path / "rec", max_ulp=1).ok
  report = testing.check({"x": two_ulp}, tmp_path / "rec", max_ulp=2)
  assert report.ok and report.leaves[0].max_ulp == 2 and report.leaves[0].status == "within"
  for rtol, atol in ((1e-7, 0.0), (3e-7, 0.0), (0.0, 1e-7), (0.0, 5e-7)):
    ours = testing.check({"x": two_ulp}, tmp_path / "rec", rtol=rtol, atol=atol).ok
    assert ours == _allclose_passes(two_ulp, x, rtol, atol), (rtol, atol)
  with pytest.raises(ValueError, match="max_ulp must be a non-negative number"):
    testing.check({"x": x}, tmp_path / "rec", max_ulp=-1)


def test_python_floats_from_float32_are_measured_in_float32_ulp(tmp_path):
  losses = np.linspace(0.5, 2.0, 4, dtype=np.float32)
  testing.record({"history": [float(v) for v in losses]}, tmp_path / "rec")
  report = testing.check({"history": [float(v) for v in _ulps_apart(losses, 1)]},
                         tmp_path / "rec", max_ulp=1)
  assert report.ok, str(report)
  assert [l.max_ulp for l in report.leaves] == [1, 1, 1, 1]


def test_a_nan_in_one_run_only_is_beyond_any_ulp_bound(tmp_path):
  x = np.array([1.0, np.nan, 3.0], np.float32)
  testing.record({"x": x}, tmp_path / "rec")
  assert testing.check({"x": x.copy()}, tmp_path / "rec").ok  # NaN == NaN here
  report = testing.check({"x": np.array([1.0, 2.0, 3.0], np.float32)}, tmp_path / "rec",
                         max_ulp=10**9)
  assert not report.ok and "NaN in one run only" in str(report)


def test_the_cross_version_default_applies_when_versions_differ(tmp_path):
  x = np.linspace(-1, 1, 16, dtype=np.float32)
  testing.record({"x": x}, tmp_path / "rec")
  manifest = json.loads((tmp_path / "rec" / "manifest.json").read_text())
  manifest["producer"]["jax"] = "0.4.38"  # as if recorded on an older JAX
  (tmp_path / "rec" / "manifest.json").write_text(json.dumps(manifest))
  bound = testing.CROSS_VERSION_MAX_ULP
  report = testing.check({"x": _ulps_apart(x, bound)}, tmp_path / "rec")
  assert report.ok and not report.tolerance.exact, str(report)
  assert "default across versions: recorded on jax 0.4.38" in str(report)
  assert not testing.check({"x": x * np.float32(1.001)}, tmp_path / "rec").ok


def test_a_different_device_count_is_pointed_out(tmp_path):
  n = jax.local_device_count()
  testing.record(lambda: {"x": jax.pmap(lambda v: v * 2)(np.ones((n, 2)))}, tmp_path / "rec")
  manifest = json.loads((tmp_path / "rec" / "manifest.json").read_text())
  assert manifest["producer"]["device_count"] == jax.device_count()
  manifest["producer"]["device_count"] = 2 * n  # as if recorded on a larger machine
  (tmp_path / "rec" / "manifest.json").write_text(json.dumps(manifest))
  report = str(testing.check(lambda: {"x": jax.pmap(lambda v: v * 2)(np.ones((n, 2)))},
                             tmp_path / "rec"))
  assert (f"note: recorded with {2 * n} devices, this run has {n} (on CPU, set "
          f"XLA_FLAGS=--xla_force_host_platform_device_count={2 * n})") in report


def test_multi_process_recordings_live_in_one_directory_per_process(tmp_path):
  testing.record({"x": np.zeros(2)}, tmp_path / "rec")
  assert sorted(os.listdir(tmp_path / "rec")) == ["leaves", "manifest.json"]  # one process: DIR
  os.makedirs(tmp_path / "mp" / "process_0")
  with pytest.raises(FileNotFoundError, match="multi-process recording"):
    testing.load(tmp_path / "mp")


def test_record_rejects_leaves_it_cannot_store(tmp_path):
  with pytest.raises(TypeError, match=r"output leaf at \['f'\] is a object"):
    testing.record({"f": object()}, tmp_path / "rec")


@pytest.mark.parametrize("spec", [("x",), ("x", None), (None, "x"), ()])
def test_the_process_local_block_of_a_sharded_array_is_its_value(mesh8, spec):
  """On one process every shard is local, so the block is the whole array."""
  x = jax.device_put(np.arange(64.0, dtype=np.float32).reshape(8, 8),
                     jax.sharding.NamedSharding(mesh8, jax.sharding.PartitionSpec(*spec)))
  block = recordings.process_local_block("['x']", x)
  assert block.dtype == x.dtype and block.tobytes() == np.asarray(x).tobytes()
  assert block.shape == x.shape
