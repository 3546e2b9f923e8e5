"""`check --per-call --calibrate`: the per-call bound measured from JAX's own pmap.

Programs recorded under legacy jax.pmap on jax 0.6.0 and checked per call on jax 0.10.2:
the calibration runs the recorded program under 0.10.2's own jax.pmap first and prints
the bound it derives from that run's drift (pmap_compat/testing/calibrate.py); the mode
under test (the codemod's output, patched(), the program as it is) is checked with it.
The bound is read back from the output, never written here: JAX's own pmap must pass at
it, and a 0.01% change of one constant in a site must fail at it.
"""
import json
import os
import re
import shutil
import textwrap

import pytest

from pmap_compat.testing import recordings
from pmap_compat.testing.__main__ import main
from recording_cli import EXAMPLES, cli, edit_one_line, output
from support import venvs
from test_per_call import _converted_program

# One SGD step of a small MLP. b1's gradient is zero but for rounding (the centring
# removes it, as BatchNorm does), so b1 (zero-initialised) is rounding noise: across
# releases it moves by far more than the default bound's 6 ulp at its scale.
STEP = textwrap.dedent('''\
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np


    def loss_fn(params, x, y):
      h = x @ params["w1"] + params["b1"]
      h = h - h.mean(axis=0)
      out = jnp.tanh(h) @ params["w2"] + params["b2"]
      return jnp.mean((out - y) ** 2)


    @functools.partial(jax.pmap, axis_name="batch")
    def train_step(params, x, y):
      loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
      grads = jax.lax.pmean(grads, "batch")
      params = jax.tree_util.tree_map(lambda p, g: p - 0.05 * g, params, grads)
      return params, jax.lax.pmean(loss, "batch")


    def run(steps: int = 3) -> dict:
      n = jax.local_device_count()
      rng = np.random.default_rng(0)
      params = {"w1": rng.normal(size=(32, 64)).astype(np.float32) / 6,
                "b1": np.zeros(64, np.float32),
                "w2": rng.normal(size=(64, 16)).astype(np.float32) / 8,
                "b2": np.zeros(16, np.float32)}
      params = jax.tree_util.tree_map(lambda p: np.broadcast_to(p, (n, *p.shape)), params)
      losses = []
      for _ in range(steps):
        x = rng.normal(size=(n, 16, 32)).astype(np.float32)
        y = rng.normal(size=(n, 16, 16)).astype(np.float32)
        params, loss = train_step(params, x, y)
        losses.append(loss)
      return {"params": params, "loss": jnp.stack(losses)}
''')
LEARNING_RATE, CHANGED_RATE = "p - 0.05 * g", "p - 0.050005 * g"  # 0.01% more


def _replaced(text: str, *pairs: tuple[str, str]) -> str:
  for old, new in pairs:
    assert text.count(old) == 1, old
    text = text.replace(old, new)
  return text


# The same step accumulating gradients over micro-batches in a scan: `record` stores every
# iteration, and the worst one sets the bound.
ACCUMULATE = _replaced(
    STEP,
    ("  loss, grads = jax.value_and_grad(loss_fn)(params, x, y)\n",
     "  def accumulate(total, batch):\n"
     "    loss, grads = jax.value_and_grad(loss_fn)(params, *batch)\n"
     "    return jax.tree_util.tree_map(jnp.add, total, grads), loss\n"
     "  zeros = jax.tree_util.tree_map(jnp.zeros_like, params)\n"
     "  grads, losses = jax.lax.scan(accumulate, zeros, (x, y))\n"
     "  loss = losses.mean()\n"),
    ("size=(n, 16, 32)", "size=(n, 4, 16, 32)"), ("size=(n, 16, 16)", "size=(n, 4, 16, 16)"))
LOSS_IN_LOOP, CHANGED_LOSS = "grads), loss\n", "grads), loss * 1.0001\n"

BOUND = re.compile(r"calibrated per-call bound from jax\.pmap (\S+)'s own drift on this "
                   r"program: --max-ulp (\d+) --atol (\S+) \(JAX's own: max (\d+) ulp, max abs "
                   r"(\S+) in rounding noise\)")


def _bound(text: str) -> tuple[int, float, int, float]:
  """(max_ulp, atol, JAX's own max ulp, JAX's own max abs in rounding noise), as printed."""
  found = BOUND.search(text)
  assert found, text
  assert found.group(1) == venvs.NEWEST
  return int(found.group(2)), float(found.group(3)), int(found.group(4)), float(found.group(5))


# What `check --calibrate` says where JAX's own pmap on the newest release reproduces the
# recording bit for bit: XLA compiles the step alike on some CPUs (an AMD EPYC without
# AVX-512), so there is no drift to calibrate from and the bound stays the default.
NO_DRIFT = ("JAX's own pmap reproduces every recorded call bit for bit, so the bound is the "
            "default")


def _needs_drift(calibration: str) -> None:
  """Skips a test of the calibrated bound where this machine shows no drift to set one."""
  if NO_DRIFT in calibration:
    pytest.skip(f"jax {venvs.NEWEST} and 0.6.0 agree bit for bit on this CPU: {NO_DRIFT}")


def _tolerance_line(max_ulp: int, atol: float) -> str:
  return (f"tolerance per call: max {max_ulp} ulp (elementwise or at leaf scale)"
          + (f" or atol {atol:g}" if atol else "")
          + f" (calibrated from jax.pmap {venvs.NEWEST}'s own drift on this program; each output "
          "leaf within twice JAX's own ulp on it, at least 6)")


def _record(source: str, directory) -> tuple[str, str]:
  """`source` as directory/original/mlp_step.py, recorded under legacy pmap on jax 0.6.0."""
  program = os.path.join(str(directory), "original", "mlp_step.py")
  os.makedirs(os.path.dirname(program))
  with open(program, "w", encoding="utf-8") as f:
    f.write(source)
  out = os.path.join(str(directory), "recording")
  r = cli(["record", program, "--out", out])
  assert r.returncode == 0 and "(jax 0.6.0, legacy jax.pmap)" in r.stdout, output(r)
  return program, out


def _check(*args: str) -> tuple[int, str]:
  r = cli(["check", *args, "--per-call"], venvs.NEWEST)
  assert r.returncode in (0, 1), output(r)
  return r.returncode, r.stdout


@pytest.fixture(scope="module")
def step(tmp_path_factory) -> tuple[str, str, str]:
  """STEP recorded on jax 0.6.0, and the codemod's rewrite of it (another directory)."""
  directory = tmp_path_factory.mktemp("step")
  program, recording = _record(STEP, directory)
  return program, recording, _converted_program(program, directory / "converted")


@pytest.fixture(scope="module")
def calibrated_step(step) -> str:
  """The converted step checked per call on jax 0.10.2 with --calibrate: its output."""
  _, recording, converted = step
  rc, text = _check(converted, "--against", recording, "--calibrate")
  assert rc == 0, text
  return text


def test_the_calibrated_bound_passes_a_step_the_default_fails(step, calibrated_step):
  _needs_drift(calibrated_step)
  original, recording, converted = step
  rc, text = _check(converted, "--against", recording)
  assert rc == 1 and "leaf [0]['b1']" in text, text  # the default: 6 ulp, no atol

  lines = calibrated_step.splitlines()
  assert lines[0].startswith(f"calibrating: {original} on jax {venvs.NEWEST} under jax.pmap "
                             "(JAX's shard_map-based pmap), unpatched, per call against the "
                             "recording: 3 recorded calls"), lines[0]
  max_ulp, atol, own_ulp, own_abs = _bound(calibrated_step)
  assert own_ulp > 0 and own_abs > 0, calibrated_step  # the step drifts, b1 is noise
  assert max_ulp >= max(6, 2 * own_ulp) and atol >= 2 * own_abs, calibrated_step
  assert any("leaf [0]['b1']" in l for l in lines if l.startswith("  JAX's own rounding")), lines
  assert _tolerance_line(max_ulp, atol) in lines
  assert "running:  jax 0.10.2 (code that does not call pmap (converted code / shard_map)), " \
      "cpu x8" in lines
  assert lines[-1].startswith("PASS (1 sites reached, 3 recorded calls replayed"), lines[-1]


def test_jax_own_pmap_passes_at_the_printed_bound(step, calibrated_step):
  """The reference itself, checked at the printed bound as a user would pass it."""
  _needs_drift(calibrated_step)
  original, recording, _ = step
  max_ulp, atol, _, _ = _bound(calibrated_step)
  rc, text = _check(original, "--against", recording, "--max-ulp", str(max_ulp), "--atol",
                    str(atol))
  assert rc == 0, text
  assert text.rstrip().splitlines()[-1].startswith("PASS ("), text


def test_a_0_01_percent_learning_rate_change_fails_at_its_site(step, calibrated_step, tmp_path):
  """The calibration runs the recorded program, not the changed one: the same bound."""
  _needs_drift(calibrated_step)
  original, recording, _ = step
  changed = _converted_program(original, tmp_path)
  edit_one_line(changed, LEARNING_RATE, CHANGED_RATE)
  rc, text = _check(changed, "--against", recording, "--calibrate")
  assert rc == 1, text
  assert _bound(text) == _bound(calibrated_step)
  first = next(l for l in text.splitlines() if l.startswith("first beyond tolerance:"))
  assert first.startswith("first beyond tolerance: site mlp_step:train_step, call 0, leaf "
                          "[0]['b2']"), first


@pytest.fixture(scope="module")
def accumulate(tmp_path_factory) -> tuple[str, str]:
  return _record(ACCUMULATE, tmp_path_factory.mktemp("accumulate"))


def test_the_worst_loop_iteration_sets_the_bound(accumulate, tmp_path):
  program, recording = accumulate
  rc, text = _check(program, "--against", recording, "--calibrate", "--patched")
  assert rc == 0, text
  _needs_drift(text)
  max_ulp, _, own_ulp, _ = _bound(text)
  assert own_ulp > 0 and max_ulp >= max(6, 2 * own_ulp), text
  [worst] = [l for l in text.splitlines() if l.startswith("  JAX's own largest ulp")]
  assert worst.endswith("float32[]") and "loop 0 (scan at mlp_step.py:" in worst, worst
  assert f"{own_ulp} ulp, site mlp_step:train_step call " in worst, worst
  assert "running:  jax 0.10.2 (pmap_compat.pmap), cpu x8" in text

  changed = _converted_program(program, tmp_path)
  edit_one_line(changed, LOSS_IN_LOOP, CHANGED_LOSS)
  rc, text = _check(changed, "--against", recording, "--calibrate")
  assert rc == 1 and _bound(text)[0] == max_ulp, text
  first = next(l for l in text.splitlines() if l.startswith("first beyond tolerance:"))
  assert first.startswith("first beyond tolerance: site mlp_step:train_step, call 0, in its "
                          "loops: loop 0 (scan at mlp_step.py:"), first


def test_a_program_changed_since_recording_is_not_calibrated_from(tmp_path):
  """Edited in place: its own run would calibrate the change into the bound (shown with
  --calibrate-with, which warns), so --calibrate refuses it; the recorded source given
  with --calibrate-with calibrates, and the change fails at that bound."""
  program, recording = _record(ACCUMULATE, tmp_path)
  kept = os.path.join(str(tmp_path), "kept", "mlp_step.py")
  os.makedirs(os.path.dirname(kept))
  shutil.copy(program, kept)
  edit_one_line(program, LEARNING_RATE, CHANGED_RATE)

  rc, text = _check(program, "--against", recording, "--calibrate")
  assert rc == 1, text
  lines = text.splitlines()
  assert lines[0].startswith(f"calibration not possible: {program} changed since it was "
                             "recorded (converted in place, or edited)"), lines[0]
  assert lines[0].endswith("the per-call bound stays the default: max 6 ulp (elementwise or at "
                           "leaf scale) (default across versions: recorded on jax 0.6.0, "
                           "running jax 0.10.2)"), lines[0]

  rc, text = _check(program, "--against", recording, "--calibrate", "--calibrate-with", kept)
  assert rc == 1 and text.startswith(f"calibrating: {kept} on jax"), text
  _bound(text)

  rc, text = _check(program, "--against", recording, "--calibrate", "--calibrate-with", program)
  assert text.startswith(f"note: {program} is not the recorded program's source (its sha256 "
                         "differs): a change of its arithmetic is calibrated into the bound")
  assert rc == 0, text  # what the refusal prevents


def test_where_jax_own_pmap_cannot_run_the_program_the_default_stays(tmp_path):
  """jax 0.10.2's own pmap cannot run replicate_loop (a removed API); patched() can."""
  program, recording = os.path.join(EXAMPLES, "replicate_loop.py"), str(tmp_path / "rec")
  r = cli(["record", program, "--out", recording])
  assert r.returncode == 0, output(r)
  rc, text = _check(program, "--against", recording, "--calibrate", "--patched")
  assert rc == 0, text
  lines = text.splitlines()
  assert lines[0].startswith(f"calibration not possible: {program} does not run on jax 0.10.2 "
                             "under jax.pmap (JAX's shard_map-based pmap): AttributeError: "), (
                                 lines[0])
  assert lines[0].endswith("; the per-call bound stays the default: max 6 ulp (elementwise or "
                           "at leaf scale) (default across versions: recorded on jax 0.6.0, "
                           "running jax 0.10.2)"), lines[0]
  assert ("tolerance per call: max 6 ulp (elementwise or at leaf scale) (default across "
          "versions: recorded on jax 0.6.0, running jax 0.10.2)") in lines


def test_on_the_recording_jax_the_bound_stays_bit_for_bit(step):
  original, recording, _ = step
  r = cli(["check", original, "--against", recording, "--per-call", "--calibrate", "--patched"])
  assert r.returncode == 0, output(r)
  lines = r.stdout.splitlines()
  assert lines[0].startswith(f"calibrating: {original} on jax 0.6.0 under legacy jax.pmap, "
                             "unpatched, per call against the recording: 3 recorded calls, "
                             "3 identical"), lines[0]
  assert lines[1] == ("calibrated per-call bound: JAX's own pmap reproduces every recorded call "
                      "bit for bit, so the bound is the default: bit for bit (same jax 0.6.0 "
                      "as the recording)")
  assert "tolerance per call: bit for bit (same jax 0.6.0 as the recording)" in lines


def test_a_recording_without_the_source_digest_asks_for_the_original(step, tmp_path, capsys):
  original, recording, _ = step
  old = str(tmp_path / "old")
  shutil.copytree(recording, old)
  manifest = os.path.join(old, recordings.MANIFEST)
  data = json.load(open(manifest, encoding="utf-8"))
  del data["producer"]["program_sha256"]  # as recorded before --calibrate existed
  with open(manifest, "w", encoding="utf-8") as f:
    json.dump(data, f)
  assert main(["check", original, "--against", old, "--per-call", "--calibrate"]) == 0
  first = capsys.readouterr().out.splitlines()[0]
  assert first.startswith("calibration not possible: the recording keeps no digest of its "
                          "program's source"), first
  assert "give the recorded program with --calibrate-with ORIGINAL" in first


@pytest.mark.parametrize("extra, message", [
    ([], "--calibrate sets the per-call bound: use it with --per-call"),
    (["--per-call", "--max-ulp", "8"], "--calibrate sets the bound that --max-ulp would"),
    (["--per-call", "--atol", "1e-7", "--rtol", "0"],
     "--calibrate sets the bound that --rtol / --atol would"),
])
def test_calibrate_takes_no_other_bound_and_needs_per_call(tmp_path, capsys, extra, message):
  args = ["check", "prog.py", "--against", str(tmp_path), "--calibrate", *extra]
  assert main(args) == 2
  assert message in capsys.readouterr().err
