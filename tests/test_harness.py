"""The test harness itself: the device guard, the comparison helper, the CLI entry point."""
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pmap_compat.testing as pt
from support import legacy_recordings
from support.compare import (assert_trees_equal, compare_call, compare_with_jax_pmap,
                             compare_with_legacy, run_program)
from support.jax_lines import (LEGACY, NEWEST, jax06_only_module, on_legacy_line, running_jax,
                               skip_reason)

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


def test_a_module_skips_itself_off_the_legacy_line():
  if on_legacy_line():
    assert jax06_only_module("imports PmapSharding") is None
  else:
    with pytest.raises(pytest.skip.Exception,
                       match=f"jax06_only: imports PmapSharding; this is jax {running_jax()}"):
      jax06_only_module("imports PmapSharding")


@pytest.mark.jax010_only(reason="JAX's own jax.pmap is the reference")
def test_jax_pmap_comparison_where_jax_pmap_works():
  program = lambda pm: pm(lambda v: (v * 2, jax.lax.psum(v, "i")), axis_name="i")(
      np.arange(16, dtype=np.float32).reshape(8, 2))
  assert compare_with_jax_pmap(program, _vmap_pmap).error is None
  with pytest.raises(AssertionError, match="values differ"):
    compare_with_jax_pmap(program, _off_by_one_pmap)
  nested = lambda pm: pm(pm(lambda v: jax.lax.psum(v, ("i", "j")), "j"), "i")(np.ones((2, 4)))
  assert compare_with_jax_pmap(nested, _vmap_pmap).error is not None  # JAX's pmap rejects it


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


# --------------------------------------------------------------- recorded legacy results

CASE = "tests/pmap_compat/test_example.py::test_case[x-1]__0"


def _psum_program(pmap):
  return pmap(lambda v: (v * 2, jax.lax.psum(v, "i")), axis_name="i")(
      np.arange(16, dtype=np.float32).reshape(8, 2))


def _mismatched_sizes(pmap):
  return pmap(lambda a, b: a + b.sum())(np.zeros(8, np.float32), np.zeros(4, np.float32))


def _record(tmp_path, program, case=CASE):
  """Legacy's outcome of `program`, stored as the case's recording (jax 0.6.0)."""
  outcome = run_program(program, jax.pmap)
  legacy_recordings.write(case, outcome.value, outcome.error, root=tmp_path)
  return outcome


def test_case_names_follow_the_test_and_count_its_calls(tmp_path):
  node = "tests/pmap_compat/test_x.py::TestA::test_b[float32-(8, 2)]"
  assert [legacy_recordings.next_case(node) for _ in range(2)] == [f"{node}__0", f"{node}__1"]
  assert legacy_recordings.case_directory(f"{node}__1", tmp_path) == (
      tmp_path / "pmap_compat" / "test_x" / "TestA.test_b[float32-_8_2_]__1")
  long = legacy_recordings.case_directory(f"tests/t.py::test_{'a' * 300}[1]__0", tmp_path)
  other = legacy_recordings.case_directory(f"tests/t.py::test_{'a' * 300}[2]__0", tmp_path)
  assert len(long.name) <= 120 and long != other
  assert legacy_recordings.running_test() == (
      "tests/test_harness.py::test_case_names_follow_the_test_and_count_its_calls")


@pytest.mark.jax06_only(reason="records legacy jax.pmap in-process")
@pytest.mark.parametrize("program", [_psum_program, _mismatched_sizes])
def test_a_fresh_legacy_run_matches_its_recording(tmp_path, program):
  _record(tmp_path, program)
  again = run_program(program, jax.pmap)
  legacy_recordings.check_fresh(CASE, again.value, again.error, root=tmp_path)


@pytest.mark.jax06_only(reason="records legacy jax.pmap in-process")
def test_a_missing_or_stale_recording_fails_on_the_legacy_line(tmp_path):
  legacy = run_program(_psum_program, jax.pmap)
  with pytest.raises(AssertionError, match=r"no legacy recording .*RECORD_LEGACY=1 .*"
                     r"'tests/pmap_compat/test_example.py::test_case\[x-1\]'.*make record-legacy"):
    legacy_recordings.check_fresh(CASE, legacy.value, None, root=tmp_path)
  _record(tmp_path, _psum_program)
  doubled, psum = legacy.value
  off_by_one_ulp = (doubled, jnp.nextafter(psum, jnp.float32(np.inf)))
  with pytest.raises(AssertionError, match="stale(.|\n)*BEYOND TOLERANCE"):
    legacy_recordings.check_fresh(CASE, off_by_one_ulp, None, root=tmp_path)
  with pytest.raises(AssertionError, match="stale.*recorded legacy returned normally, now it "
                     "raised builtins.ValueError: boom"):
    legacy_recordings.check_fresh(CASE, None, ValueError("boom"), root=tmp_path)
  with pytest.raises(AssertionError, match="stale.*now output leaf at .*is a function"):
    legacy_recordings.check_fresh(CASE, {"f": lambda: 0}, None, root=tmp_path)
  _stored(tmp_path, legacy.value, case=CASE.replace("test_case", "test_other"))
  with pytest.raises(AssertionError, match="records .*test_other.* not .*two cases"):
    legacy_recordings.check_fresh(CASE, legacy.value, None, root=tmp_path)


@pytest.mark.jax06_only(reason="records legacy jax.pmap in-process")
def test_an_error_message_may_differ_only_in_object_addresses(tmp_path):
  legacy_recordings.write(CASE, None, TypeError("bad <function f at 0x7f01>"), root=tmp_path)
  legacy_recordings.check_fresh(CASE, None, TypeError("bad <function f at 0x7aa2>"),
                                root=tmp_path)
  with pytest.raises(AssertionError, match="stale"):
    legacy_recordings.check_fresh(CASE, None, TypeError("bad <function g at 0x7aa2>"),
                                  root=tmp_path)


def _stored(tmp_path, outputs=None, **metadata):
  """A recording at CASE's place made by this JAX (any line), of `metadata['case']`."""
  pt.record(outputs, legacy_recordings.case_directory(CASE, tmp_path),
            metadata={"case": CASE, **metadata})


def test_the_recording_is_the_reference_off_the_legacy_line(tmp_path):
  value = (np.arange(8, dtype=np.float32), np.int32(3))
  _stored(tmp_path, value)
  assert legacy_recordings.reference(CASE, value, None, root=tmp_path) is None
  nudged = (np.nextafter(value[0], np.float32(np.inf)), value[1])
  with pytest.raises(AssertionError, match="values differ"):
    legacy_recordings.reference(CASE, nudged, None, root=tmp_path)  # same jax: bit for bit
  assert legacy_recordings.reference(CASE, nudged, None, atol=1e-5, root=tmp_path) is None
  with pytest.raises(AssertionError, match="values differ"):
    legacy_recordings.reference(CASE, (value[0], np.int32(4)), None, atol=1e-5, root=tmp_path)
  with pytest.raises(AssertionError, match="raised RuntimeError: boom; legacy"):
    legacy_recordings.reference(CASE, None, RuntimeError("boom"), root=tmp_path)
  with pytest.raises(AssertionError, match="no legacy recording"):
    legacy_recordings.reference(CASE, value, None, root=tmp_path / "none")


def test_a_recorded_exception_is_the_reference_off_the_legacy_line(tmp_path):
  _stored(tmp_path, legacy_error={"type": "builtins.ValueError", "message": "sizes differ"})
  rebuilt = legacy_recordings.reference(CASE, None, ValueError("x"), root=tmp_path)
  assert type(rebuilt) is ValueError and str(rebuilt) == "sizes differ"
  with pytest.raises(AssertionError, match="raised TypeError"):
    legacy_recordings.reference(CASE, None, TypeError("x"), root=tmp_path)
  with pytest.raises(AssertionError, match="returned 1"):
    legacy_recordings.reference(CASE, 1, None, root=tmp_path)
  renamed = legacy_recordings.RecordedError("jaxlib.xla_extension.XlaRuntimeError", "m")
  assert renamed.matches_type(jax.errors.JaxRuntimeError("m"))
  assert isinstance(renamed.rebuilt(), jax.errors.JaxRuntimeError)
  moved = legacy_recordings.RecordedError("jax._src.gone.JaxValueError", "m")
  assert moved.matches_type(type("JaxValueError", (ValueError,), {})("m"))
  assert type(moved.rebuilt()).__name__ == "JaxValueError" and str(moved.rebuilt()) == "m"


def test_an_unrecordable_legacy_result_fails_off_the_legacy_line(tmp_path):
  _stored(tmp_path, unrecordable="output leaf at <root> is a Mesh")
  with pytest.raises(AssertionError, match="could not be recorded .*Mesh.*jax06_only"):
    legacy_recordings.reference(CASE, 1, None, root=tmp_path)


def _recordings() -> list[tuple[str, str]]:
  found = []
  for manifest in sorted(legacy_recordings.DATA_ROOT.rglob("manifest.json")):
    case = json.loads(manifest.read_text())["metadata"]["case"]
    found.append((str(manifest.parent.relative_to(legacy_recordings.DATA_ROOT)), case))
  return found


def test_every_recording_belongs_to_an_existing_test():
  """Recordings of renamed or deleted tests are left-overs: `make record-legacy` drops them."""
  recordings = _recordings()
  assert recordings, "no recordings under tests/data/legacy; run make record-legacy"
  for where, case in recordings:
    assert legacy_recordings.case_directory(case) == legacy_recordings.DATA_ROOT / where, case
    module, _, test = case.rpartition("__")[0].partition("::")
    function = test.split("::")[-1].split("[")[0]
    source = os.path.join(ROOT, module)
    assert os.path.exists(source), f"{where}: {module} no longer exists"
    with open(source, encoding="utf-8") as f:
      assert f"def {function}(" in f.read(), f"{where}: {module} defines no {function}"
