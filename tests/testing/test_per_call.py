"""Per-call record and replay (`record --calls K`, `check --per-call`).

Recorded under legacy jax.pmap on jax 0.6.0 (this suite's JAX), checked per call on the
same JAX (bit for bit) and on jax 0.10.2 with its own jax.pmap, under
pmap_compat.patched() and as the codemod's output. The cross-version runs reuse
tools/equivalence.py's machinery (its codemod trees, its environments).
"""
import json
import os
import sys

import pytest

from pmap_compat.testing import calls, per_call, recordings
from pmap_compat.testing.__main__ import main
from recording_cli import EXAMPLES, cli, edit_one_line, output, two_process_job
from support import venvs

sys.path.insert(0, os.path.join(venvs.ROOT, "tools"))
import equivalence  # noqa: E402  pylint: disable=wrong-import-position


def _record(program: str, out: str, *extra: str) -> None:
  assert main(["record", program, "--out", out, *extra]) == 0


def test_same_jax_replays_every_call_bit_for_bit(tmp_path, capsys):
  program, out = os.path.join(EXAMPLES, "dp_sgd.py"), str(tmp_path / "rec")
  _record(program, out, "--calls", "2", "--kwargs", '{"steps": 3}')
  text = capsys.readouterr().out
  assert "recorded the first 2 calls of 1 pmap sites (2 calls," in text
  stored = calls.read(out)
  [site] = stored.sites.values()
  assert (site.key, site.calls, site.recorded) == ("dp_sgd:train_step", 3, 2)
  assert site.file == program and site.line is not None

  assert main(["check", program, "--against", out, "--per-call", "--kwargs",
               '{"steps": 3}']) == 0
  lines = capsys.readouterr().out.splitlines()
  assert "tolerance per call: bit for bit (same jax 0.6.0 as the recording)" in lines
  assert "  site dp_sgd:train_step (dp_sgd.py:21): called 3 times (recorded run: 3, 2 stored)" in (
      lines)
  assert lines.count("    call 0: identical") == 1 and lines.count("    call 1: identical") == 1
  assert lines[-1] == ("PASS (1 sites reached, 2 recorded calls replayed: 2 identical, 0 within "
                       "tolerance)")


def test_replicated_state_is_stored_once(tmp_path, capsys):
  """replicate_loop's parameters are replicated over the 8 devices: one copy on disk."""
  out = str(tmp_path / "rec")
  _record(os.path.join(EXAMPLES, "replicate_loop.py"), out, "--calls", "1")
  capsys.readouterr()
  stored = calls.read(out)
  [site] = stored.sites.values()
  manifest = json.load(open(os.path.join(stored.directory, site.directory, "call_00000",
                                         "inputs", recordings.MANIFEST)))
  replicated = [e for e in manifest["leaves"] if e.get("copies") == 8]
  assert replicated, manifest["leaves"]
  inputs, _ = stored.call(site, 0)
  for entry in replicated:
    [leaf] = [l for l in inputs.leaves if l.path == entry["path"]]
    assert leaf.value.shape == tuple(entry["shape"]) and (leaf.value == leaf.value[:1]).all()


def test_the_size_cap_stops_the_recording_naming_the_option(tmp_path, capsys):
  out = str(tmp_path / "rec")
  assert main(["record", os.path.join(EXAMPLES, "dp_sgd.py"), "--out", out,
               "--max-call-bytes", "1000"]) == 2
  err = capsys.readouterr().err
  assert "recording call 0 of pmap site dp_sgd:train_step (dp_sgd.py:21)" in err
  assert "over the cap of 1,000 (--max-call-bytes / max_call_bytes)" in err
  assert not os.path.exists(out)
  assert not [d for d in os.listdir(tmp_path) if d.startswith(".calls-")]  # staging removed


def test_without_per_call_data_the_check_names_the_option(tmp_path, capsys):
  program, out = os.path.join(EXAMPLES, "dp_sgd.py"), str(tmp_path / "rec")
  _record(program, out, "--calls", "0")
  assert main(["check", program, "--against", out, "--per-call"]) == 2
  assert "holds no per-call recording" in capsys.readouterr().err


TWO_SITES = '''
import jax
import jax.numpy as jnp
import numpy as np

def scale(x):
  return x * 2.0

def shift(x):
  return x + jax.lax.psum(x, "i")

def run():
  x = np.arange(8, dtype=np.float32)
  a = jax.pmap(scale)(x)
  b = jax.pmap(shift, axis_name="i")(a)
  return {"a": a, "b": b}
'''


def test_sites_only_one_run_has_fail_the_check(tmp_path, capsys):
  program = tmp_path / "two_sites.py"
  program.write_text(TWO_SITES)
  out = str(tmp_path / "rec")
  _record(str(program), out)
  capsys.readouterr()
  program.write_text(TWO_SITES.replace("shift", "moved"))  # a renamed site
  assert main(["check", str(program), "--against", out, "--per-call"]) == 1
  text = capsys.readouterr().out
  assert "  recorded but never reached: site two_sites:shift (two_sites.py:9), called 1 times" in (
      text)
  assert "  reached but never recorded: site two_sites:moved (two_sites.py:9), called 1 times" in (
      text)
  assert "    call 0: identical" in text  # `scale` still checked
  assert text.rstrip().splitlines()[-1].startswith(
      "FAIL (1 recorded sites never reached; 1 sites reached but never recorded;")


def _converted(example: str, directory) -> str:
  """The codemod's --target jax rewrite of one example (support module included)."""
  return _converted_program(os.path.join(EXAMPLES, example + ".py"), directory)


def _converted_program(program: str, directory) -> str:
  """The codemod's --target jax rewrite of one program (support module included)."""
  tree = equivalence.rewrite_files({program: ()}, "jax", str(directory))
  assert tree.error is None, tree.report
  return os.path.join(str(directory), os.path.basename(program))


@pytest.fixture(scope="module")
def broadcast_params(tmp_path_factory) -> str:
  """examples/broadcast_params.py recorded per call under legacy jax.pmap on jax 0.6.0."""
  out = str(tmp_path_factory.mktemp("rec") / "broadcast_params")
  r = cli(["record", os.path.join(EXAMPLES, "broadcast_params.py"), "--out", out])
  assert r.returncode == 0 and "(jax 0.6.0, legacy jax.pmap)" in r.stdout, output(r)
  return out


@pytest.mark.parametrize("mode", ["pmap", "patched", "codemod"])
def test_recorded_on_legacy_checks_per_call_on_jax_0_10_2(broadcast_params, tmp_path, mode):
  program = os.path.join(EXAMPLES, "broadcast_params.py")
  args = {"pmap": [program], "patched": [program, "--patched"],
          "codemod": [_converted("broadcast_params", tmp_path)]}[mode]
  r = cli(["check", *args, "--against", broadcast_params, "--per-call"], venvs.NEWEST)
  assert r.returncode == 0, output(r)
  lines = r.stdout.splitlines()
  running = {"pmap": "jax.pmap (JAX's shard_map-based pmap)", "patched": "pmap_compat.pmap",
             "codemod": "code that does not call pmap (converted code / shard_map)"}[mode]
  assert f"running:  jax 0.10.2 ({running}), cpu x8" in lines
  assert (f"tolerance per call: max {per_call.PER_CALL_MAX_ULP} ulp (elementwise or at leaf "
          "scale) (default across versions: recorded on jax 0.6.0, running jax 0.10.2)") in lines
  assert any(l.startswith("  site broadcast_params:") for l in lines), r.stdout
  assert lines[-1].startswith("PASS (")


def test_a_perturbed_site_is_caught_at_that_site_and_call(tmp_path):
  """One line of one site's arithmetic changed in the converted code: the per-call check on
  jax 0.10.2 names the site, the first call and the leaf; the program still runs on."""
  recording = str(tmp_path / "rec")
  r = cli(["record", os.path.join(EXAMPLES, "dp_sgd.py"), "--out", recording, "--kwargs",
           '{"steps": 3}'])
  assert r.returncode == 0, output(r)
  program = _converted("dp_sgd", tmp_path / "converted")
  edit_one_line(program, "p - 0.1 * g", "p - 0.1001 * g")
  r = cli(["check", program, "--against", recording, "--per-call", "--kwargs", '{"steps": 3}'],
          venvs.NEWEST)
  assert r.returncode == 1, output(r)
  lines = r.stdout.splitlines()
  first = next(l for l in lines if l.startswith("first beyond tolerance:"))
  assert first.startswith("first beyond tolerance: site dp_sgd:train_step, call 0, leaf [0]")
  assert "BEYOND TOLERANCE" in next(l for l in lines if l.startswith("    call 0:"))
  assert lines[-1].startswith("FAIL (3 calls beyond tolerance, the first: dp_sgd:train_step "
                              "call 0;")


def test_the_end_to_end_check_still_reports_the_drift(broadcast_params):
  """The same recording, checked end to end on jax 0.10.2: the drift of the whole run is
  reported as before (per leaf, within the cross-version bound)."""
  r = cli(["check", os.path.join(EXAMPLES, "broadcast_params.py"), "--against",
           broadcast_params], venvs.NEWEST)
  assert r.returncode == 0, output(r)
  assert "within tolerance" in r.stdout and "per-call" not in r.stdout
  assert r.stdout.rstrip().splitlines()[-1].startswith("PASS (")


@pytest.mark.slow
@pytest.mark.parametrize("mode", equivalence.PER_CALL_MODES)
@pytest.mark.parametrize("case", equivalence.CASES, ids=lambda c: c.name)
def test_every_example_checks_per_call_on_jax_0_10_2(equivalence_runner, case, mode):
  """Every example recorded per call under legacy pmap passes `check --per-call` on jax
  0.10.2 in every mode that runs it (0.10.2's own pmap fails two examples outright)."""
  result = equivalence_runner.per_call(case, mode)
  if mode == equivalence.NEWEST_PMAP and case.name in ("nested_data_model", "replicate_loop"):
    assert not result.ok  # 0.10.2's pmap cannot run them (docs/testing.md, `make demo`)
    return
  assert result.ok, result.error or "\n".join(result.outputs)


@pytest.fixture(scope="module")
def equivalence_runner(tmp_path_factory):
  return equivalence.Runner(str(tmp_path_factory.mktemp("equivalence")))


def test_staging_directories_do_not_outlive_a_failed_program(tmp_path, capsys):
  program = tmp_path / "fails.py"
  program.write_text(TWO_SITES.replace('return {"a": a, "b": b}', 'raise RuntimeError("late")'))
  assert main(["record", str(program), "--out", str(tmp_path / "rec")]) == 2
  assert "RuntimeError: late" in capsys.readouterr().err
  assert sorted(set(os.listdir(tmp_path)) - {"__pycache__"}) == ["fails.py"]


@pytest.mark.multiprocess
def test_a_multi_process_job_records_and_replays_calls_per_process(tmp_path):
  program, out = os.path.join(EXAMPLES, "multiprocess_sgd.py"), str(tmp_path / "rec")
  for r in two_process_job(["record", program, "--out", out, "--calls", "2"]):
    assert r.returncode == 0, output(r)
  for i in range(2):
    [site] = calls.read(os.path.join(out, f"process_{i}")).sites.values()
    assert (site.key, site.calls, site.recorded) == ("multiprocess_sgd:train_step", 4, 2)
  for i, r in enumerate(two_process_job(["check", program, "--against", out, "--per-call"])):
    assert r.returncode == 0, output(r)
    assert f"[process {i}/2] per-call check against {out}/process_{i}/calls" in r.stdout
    assert r.stdout.rstrip().endswith(
        "PASS (1 sites reached, 2 recorded calls replayed: 2 identical, 0 within tolerance)")
