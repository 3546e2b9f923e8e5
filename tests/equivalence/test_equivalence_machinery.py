"""The equivalence machinery itself: it catches differences, and its jax.shard_map adapter is exact."""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P

import equivalence
from pmap_compat import testing
from support.compare import assert_trees_equal

CASE = equivalence.Case("probe", "probe")


@pytest.fixture(name="result")
def result_fixture(tmp_path):
  """Makes a RunResult holding a recording of `value`, as a child process would leave it."""
  def make(value, mode="legacy"):
    testing.record(value, tmp_path / mode)
    return equivalence.RunResult("probe", mode, str(tmp_path / mode))
  return make


def test_identical_results_compare_equal(result):
  tree = {"a": jnp.arange(8.0), "k": jax.random.split(jax.random.key(0), 8), "n": 3}
  verdict = equivalence.compare(CASE, result(tree), result(tree, "other"))
  assert verdict.identical and verdict.ok, verdict.message


def test_a_one_ulp_difference_is_caught(result):
  a = jnp.linspace(0, 1, 8, dtype=jnp.float32)
  b = a.at[3].set(jnp.nextafter(a[3], jnp.float32(2)))
  verdict = equivalence.compare(CASE, result({"x": a}), result({"x": b}, "other"))
  assert not verdict.identical and not verdict.ok
  assert verdict.message.startswith("['x'] float32[8] 1 of 8 elements differ, max ulp 1")
  assert "BEYOND TOLERANCE" in verdict.message and "bit for bit" in verdict.report


def test_different_typed_keys_are_caught(result):
  k0, k1 = jax.random.split(jax.random.key(0), 8), jax.random.split(jax.random.key(1), 8)
  verdict = equivalence.compare(CASE, result(k0), result(k1, "other"))
  assert not verdict.identical and not verdict.ok


def test_numpy_instead_of_jax_array_is_caught(result):
  x = jnp.arange(8)
  verdict = equivalence.compare(CASE, result([x]), result([np.asarray(x)], "other"))
  assert not verdict.ok
  assert "type differs: recorded jax.Array, got numpy.ndarray" in verdict.message


def test_a_failed_run_is_not_identical(result):
  failed = equivalence.RunResult("probe", "other", error="RuntimeError: boom")
  verdict = equivalence.compare(CASE, result(jnp.zeros(2)), failed)
  assert not verdict.identical and not verdict.ok and verdict.message == "RuntimeError: boom"


def _psum_and_shift_x(x):
  return jax.lax.psum(x, "x"), x * jax.lax.axis_index("x")


def test_keyword_adapter_matches_experimental_shard_map(mesh8):
  x = jnp.arange(16.0).reshape(8, 2)
  want = shard_map(_psum_and_shift_x, mesh8, (P("x"),), (P(), P("x")))(x)
  got = equivalence.keyword_shard_map(
      _psum_and_shift_x, mesh=mesh8, in_specs=(P("x"),), out_specs=(P(), P("x")))(x)
  assert_trees_equal(jax.tree.map(np.asarray, want), jax.tree.map(np.asarray, got))


def test_keyword_adapter_as_decorator_and_without_checking(mesh8):
  x = jnp.arange(8.0)

  @equivalence.keyword_shard_map(mesh=mesh8, in_specs=P("x"), out_specs=P(), check_vma=False)
  def total(v):
    return jax.lax.psum(v, "x")
  want = shard_map(lambda v: jax.lax.psum(v, "x"), mesh8, P("x"), P(), check_rep=False)(x)
  assert_trees_equal(np.asarray(want), np.asarray(total(x)))


def test_keyword_adapter_requires_a_mesh():
  with pytest.raises(TypeError, match="mesh="):
    equivalence.keyword_shard_map(lambda v: v, in_specs=P(), out_specs=P())


def test_remaining_pmap_uses_sees_every_spelling(tmp_path):
  src = tmp_path / "m.py"
  src.write_text(textwrap.dedent("""\
      import jax
      from jax import pmap as p
      import functools
      f = jax.pmap(lambda x: x)
      g = functools.partial(jax.pmap, axis_name="i")
      def pmap_like(): pass
      """))
  assert equivalence.remaining_pmap_uses(str(src)) == ["m.py:2", "m.py:4", "m.py:5"]
  src.write_text("import jax\nfrom jax.experimental.shard_map import shard_map\n")
  assert equivalence.remaining_pmap_uses(str(src)) == []


def test_a_crashing_example_reports_its_error(tmp_path):
  src = tmp_path / "crash.py"
  src.write_text("def run():\n  raise ValueError('no data for step 3')\n")
  result = equivalence.run_source(equivalence.Case("crash", "crash"), "legacy", str(src),
                                  str(tmp_path / "scratch"))
  assert not result.ok and result.error == "ValueError: no data for step 3"
  assert "Traceback" in result.detail


def test_rewritten_code_must_not_import_this_project(tmp_path):
  src = tmp_path / "m.py"
  src.write_text("import jax\nimport pmap_compat\nfrom shard_map_impl import shard_map\n")
  assert equivalence.remaining_pmap_uses(str(src)) == [
      "m.py:2 (imports pmap_compat)", "m.py:3 (imports shard_map_impl)"]


def test_pmap_compat_mode_really_runs_on_pmap_compat(tmp_path):
  src = tmp_path / "which.py"
  src.write_text("import jax\ndef run():\n  return {'module': jax.pmap.__module__}\n")
  case = equivalence.Case("which", "which")
  result = equivalence.run_source(case, "pmap_compat", str(src), str(tmp_path / "s"))
  assert result.ok, result.error + result.detail
  [recording] = result.recordings()
  assert recording.leaves[0].value.startswith("pmap_compat")


def test_cli_exits_1_when_a_program_behaves_differently_under_pmap_compat(tmp_path):
  src = tmp_path / "sensitive.py"
  src.write_text("import jax, jax.numpy as jnp\n"
                 "def run():\n"
                 "  return jnp.ones(2) * jax.pmap.__module__.startswith('pmap_compat')\n")
  r = subprocess.run([sys.executable, os.path.join(equivalence.TOOLS, "equivalence.py"),
                      str(src), "--modes", "pmap_compat"], capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 1, r.stdout + r.stderr
  assert "pmap_compat vs legacy: DIFFERS (<root> float32[2] 2 of 2 elements differ" in r.stdout


def test_each_target_must_use_its_own_shard_map_api(tmp_path):
  src = tmp_path / "m.py"
  src.write_text("import jax\nfrom jax.experimental.shard_map import shard_map\n")
  assert equivalence.uses_target_api(str(src), "experimental")
  assert not equivalence.uses_target_api(str(src), "jax")
  src.write_text("import jax\nf = jax.shard_map(lambda x: x, mesh=None, in_specs=(), out_specs=())\n")
  assert equivalence.uses_target_api(str(src), "jax")
  assert not equivalence.uses_target_api(str(src), "experimental")
