"""The test harness itself: the device guard, the comparison helper, the CLI entry point."""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from support.compare import assert_trees_equal, compare_call, compare_with_legacy
from support.jax_lines import LEGACY, NEWEST, on_legacy_line, running_jax, skip_reason

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")


def _vmap_pmap(fun, axis_name=None, *, in_axes=0, out_axes=0, **unused):
  """An independent pmap for the helper's positive tests: vmap with the same axis semantics."""
  return jax.vmap(fun, in_axes=in_axes, out_axes=out_axes, axis_name=axis_name)


def _off_by_one_pmap(fun, *args, **kwargs):
  mapped = jax.pmap(fun, *args, **kwargs)
  return lambda *a, **k: jax.tree.map(lambda v: v + 1, mapped(*a, **k))


def test_suite_sees_eight_devices():
  assert len(jax.devices()) == 8


def test_guard_fails_loudly_when_jax_came_up_with_one_device():
  code = textwrap.dedent(f"""
      import os, sys
      os.environ["XLA_FLAGS"] = ""
      os.environ["JAX_PLATFORMS"] = "cpu"
      import jax
      jax.devices()
      sys.path.insert(0, {TESTS!r})
      from support.devices import require_host_devices, DeviceCountError
      try:
        require_host_devices(8)
      except DeviceCountError as e:
        print("GUARD:", e)
        sys.exit(3)
      sys.exit(0)
  """)
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert r.returncode == 3, r.stdout + r.stderr
  assert "needs 8 CPU devices but jax was initialised with 1" in r.stdout


def test_guard_sets_flag_when_jax_not_yet_imported():
  code = textwrap.dedent(f"""
      import os, sys
      os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
      os.environ["JAX_PLATFORMS"] = "cpu"
      sys.path.insert(0, {TESTS!r})
      from support.devices import require_host_devices
      print(require_host_devices(8))
  """)
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  assert r.stdout.strip() == "8"


def test_helper_accepts_an_equivalent_implementation():
  x = np.arange(16, dtype=np.int32).reshape(8, 2)
  legacy = compare_call(lambda v: (v * 2, jax.lax.psum(v, "i")), (x,), _vmap_pmap, axis_name="i")
  assert legacy.error is None
  np.testing.assert_array_equal(legacy.value[1][0], x.sum(0))


def test_helper_fails_when_values_differ():
  x = np.arange(8, dtype=np.float32)
  with pytest.raises(AssertionError, match="values differ"):
    compare_call(lambda v: v * 2, (x,), _off_by_one_pmap)


def test_helper_fails_on_dtype_shape_and_structure_differences():
  a = np.zeros((8,), np.float32)
  with pytest.raises(AssertionError, match="dtype"):
    assert_trees_equal(a, a.astype(np.float64))
  with pytest.raises(AssertionError, match="shape"):
    assert_trees_equal(a, a.reshape(8, 1))
  with pytest.raises(AssertionError, match="tree structure"):
    assert_trees_equal((a, a), [a, a])


def test_helper_is_bitwise_by_default_and_honours_tolerance():
  a = np.array([1.0, 2.0], np.float32)
  b = np.nextafter(a, np.float32(3))
  with pytest.raises(AssertionError):
    assert_trees_equal(a, b)
  assert_trees_equal(a, b, rtol=1e-6)
  with pytest.raises(AssertionError):
    assert_trees_equal(np.float32(0.0) * a[:1], -np.float32(0.0) * a[:1])


def test_helper_compares_typed_keys_by_key_data():
  k = jax.random.split(jax.random.key(0), 8)
  assert_trees_equal(k, k)
  with pytest.raises(AssertionError, match="values differ"):
    assert_trees_equal(k, jax.random.split(jax.random.key(1), 8))


def test_helper_requires_same_exception_type():
  x = np.zeros((8,), np.float32)
  y = np.zeros((4,), np.float32)
  # Legacy raises ValueError on inconsistent mapped sizes; so does vmap.
  legacy = compare_call(lambda a, b: a + b.sum(), (x, y), _vmap_pmap)
  assert isinstance(legacy.error, ValueError)

  def silently_ok(fun, **kwargs):
    return lambda *a: jnp.zeros(8)
  with pytest.raises(AssertionError, match="returned"):
    compare_call(lambda a, b: a + b.sum(), (x, y), silently_ok)

  def raises_type_error(fun, **kwargs):
    def call(*a):
      raise TypeError("wrong kind")
    return call
  with pytest.raises(AssertionError, match="TypeError"):
    compare_call(lambda a, b: a + b.sum(), (x, y), raises_type_error)


def test_helper_reports_failure_of_the_implementation():
  def broken(fun, **kwargs):
    def call(*a):
      raise RuntimeError("boom")
    return call
  with pytest.raises(AssertionError, match="boom"):
    compare_with_legacy(lambda pmap: pmap(lambda v: v)(np.zeros(8)), broken)


@pytest.mark.jax06_only
def test_jax06_only_runs_only_on_the_legacy_line():
  assert running_jax() == LEGACY


@pytest.mark.jax010_only(reason="JAX's shard_map-based jax.pmap")
def test_jax010_only_runs_only_on_0_10():
  assert running_jax().startswith("0.10.") and not on_legacy_line()


@pytest.mark.parametrize("mark, version, expected", [
    (pytest.mark.jax06_only, LEGACY, None),
    (pytest.mark.jax06_only, NEWEST,
     f"jax06_only: needs jax {LEGACY} in-process (legacy jax.pmap, PmapSharding, the C++ pmap "
     f"path); this is jax {NEWEST}"),
    (pytest.mark.jax06_only("PmapSharding outputs"), NEWEST,
     f"jax06_only: PmapSharding outputs; this is jax {NEWEST}"),
    (pytest.mark.jax06_only(reason="C++ pmap"), "0.7.2", "jax06_only: C++ pmap; this is jax 0.7.2"),
    (pytest.mark.jax010_only, NEWEST, None),
    (pytest.mark.jax010_only(reason="JAX's pmap"), LEGACY,
     f"jax010_only: JAX's pmap; this is jax {LEGACY}"),
])
def test_line_markers_skip_with_their_reason(mark, version, expected):
  assert skip_reason(mark.mark, version) == expected


@pytest.mark.parametrize("mark", [pytest.mark.jax06_only("a", "b"),
                                  pytest.mark.jax06_only("a", reason="b"),
                                  pytest.mark.jax010_only(why="b")])
def test_line_markers_reject_malformed_reasons(mark):
  with pytest.raises(TypeError, match=mark.mark.name):
    skip_reason(mark.mark, "0.7.2")


def test_cli_help():
  r = subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", "--help"],
                     capture_output=True, text=True, cwd=ROOT, timeout=120)
  assert r.returncode == 0, r.stderr
  assert "usage: pmap-to-shmap" in r.stdout and "--in-place" in r.stdout


def test_console_script_help():
  script = os.path.join(os.path.dirname(sys.executable), "pmap-to-shmap")
  if not os.path.exists(script):
    pytest.skip("project not installed into this interpreter's environment")
  r = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
  assert r.returncode == 0 and "--target" in r.stdout, r.stderr


def test_shipped_example_runs_under_legacy_pmap():
  sys.path.insert(0, os.path.join(ROOT, "examples"))
  try:
    import dp_sgd
  finally:
    sys.path.pop(0)
  out = dp_sgd.run(steps=3)
  losses = np.asarray(out["losses"])
  assert losses.shape == (3, 8)
  assert (losses[-1] < losses[0]).all()
  assert int(out["examples_per_step"][0]) == 16 * 8
