"""Per-call checks of a real third-party program across the JAX upgrade.

The Flax ImageNet example's loop (tests/real_programs/programs/flax_imagenet.py: ResNet18
with BatchNorm, SGD momentum, train and eval steps pmapped) recorded under legacy jax.pmap
in the real-programs environment of jax 0.6.0, then `check --per-call` in that of jax
0.10.2 (other Flax and optax releases too) with its own jax.pmap, under
pmap_compat.patched() and as the codemod's output: every recorded call of every site within
PER_CALL_MAX_ULP, where the end-to-end check reports the drift of the whole run.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from pmap_compat.testing import per_call
from recording_cli import cli_env, edit_one_line, output
from support import venvs

sys.path.insert(0, os.path.join(venvs.ROOT, "tests", "real_programs"))
sys.path.insert(0, os.path.join(venvs.ROOT, "tools"))
import program_catalog as catalog  # noqa: E402  pylint: disable=wrong-import-position
import equivalence  # noqa: E402  pylint: disable=wrong-import-position

TIMEOUT_S = 2400
PROGRAM = catalog.PROGRAMS["flax_imagenet"].path


def _cli(line: str, args: list[str]) -> subprocess.CompletedProcess:
  """`python -m pmap_compat.testing ARGS` in the real-programs environment of jax `line`."""
  return subprocess.run([catalog.python_for(line), "-m", "pmap_compat.testing", *args],
                        env=cli_env(), cwd=venvs.ROOT, capture_output=True, text=True,
                        timeout=TIMEOUT_S, check=False)


@pytest.fixture(scope="module")
def legacy_recording(tmp_path_factory) -> str:
  out = str(tmp_path_factory.mktemp("flax") / "legacy")
  r = _cli(catalog.LEGACY_LINE, ["record", PROGRAM, "--out", out])
  assert r.returncode == 0 and "(jax 0.6.0, legacy jax.pmap)" in r.stdout, output(r)
  assert "recorded the first 3 calls of 3 pmap sites (5 calls," in r.stdout, r.stdout
  return out


# A ResNet step's per-call rounding on jax 0.10.2 (and Flax 0.12.8) against legacy on 0.6.0
# (Flax 0.11.2), measured: at most 23 ulp at leaf scale; the BatchNorm biases' gradients,
# which the next BatchNorm's mean removes (zero but for rounding, ~1e-8), differ by up to
# 9e-8. About three times that; a 0.1% change of the gradients moves them by ~1e-6 and
# thousands of ulp.
TOLERANCE = ["--max-ulp", "64", "--atol", "3e-7"]


def _converted(tmp_path) -> str:
  tree = equivalence.rewrite_files({PROGRAM: ()}, "jax", str(tmp_path / "converted"))
  assert tree.error is None, tree.report
  return os.path.join(tree.directory, os.path.basename(PROGRAM))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pmap", "patched", "codemod"])
def test_flax_imagenet_checks_per_call_on_jax_0_10_2(legacy_recording, tmp_path, mode):
  program = _converted(tmp_path) if mode == "codemod" else PROGRAM
  args = ["check", program, "--against", legacy_recording, "--per-call", *TOLERANCE]
  r = _cli(catalog.NEWEST_LINE, args + (["--patched"] if mode == "patched" else []))
  assert r.returncode == 0, output(r)
  lines = r.stdout.splitlines()
  assert "tolerance per call: max 64 ulp (elementwise or at leaf scale) or atol 3e-07 (given)" in (
      lines)
  for site, calls in (("train_step", 3), ("<lambda>", 1), ("eval_step", 1)):
    assert any(l.startswith(f"  site flax_imagenet:{site} (flax_imagenet.py:") and
               l.endswith(f"called {calls} times (recorded run: {calls}, {calls} stored)")
               for l in lines), r.stdout
  assert lines[-1].startswith("PASS (3 sites reached, 5 recorded calls replayed:"), r.stdout


@pytest.mark.slow
def test_flax_imagenet_perturbed_gradients_are_caught_at_the_first_call(legacy_recording,
                                                                        tmp_path):
  program = _converted(tmp_path)
  edit_one_line(program, 'grads = lax.pmean(grads, axis_name="batch")',
                'grads = jax.tree.map(lambda g: g * 1.001, lax.pmean(grads, axis_name="batch"))')
  r = _cli(catalog.NEWEST_LINE, ["check", program, "--against", legacy_recording, "--per-call",
                                 *TOLERANCE])
  assert r.returncode == 1, output(r)
  first = next(l for l in r.stdout.splitlines() if l.startswith("first beyond tolerance:"))
  assert first.startswith("first beyond tolerance: site flax_imagenet:train_step, call 0, leaf "
                          "[0].opt_state[0].trace["), first


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pmap", "patched", "codemod"])
def test_flax_imagenet_passes_at_the_bound_calibrated_from_jax_own_pmap(legacy_recording,
                                                                       tmp_path, mode):
  """No tolerance given: --calibrate measures 0.10.2's own jax.pmap on the recorded program
  and prints the bound every mode then passes."""
  program = _converted(tmp_path) if mode == "codemod" else PROGRAM
  args = ["check", program, "--against", legacy_recording, "--per-call", "--calibrate",
          "--calibrate-with", PROGRAM]
  r = _cli(catalog.NEWEST_LINE, args + (["--patched"] if mode == "patched" else []))
  assert r.returncode == 0, output(r)
  lines = r.stdout.splitlines()
  assert any(l.startswith(f"calibrated per-call bound from jax.pmap {catalog.NEWEST_LINE}'s own "
                          "drift on this program: --max-ulp ") for l in lines), r.stdout
  assert lines[-1].startswith("PASS (3 sites reached, 5 recorded calls replayed:"), r.stdout


@pytest.mark.slow
def test_flax_imagenet_learning_rate_change_fails_at_the_calibrated_bound(legacy_recording,
                                                                          tmp_path):
  """A 0.01% learning-rate change fails at its site: each output leaf is bounded by JAX's
  own drift on it, so BatchNorm biases that JAX moves by ~1e3 ulp do not loosen the dense
  layer's."""
  program = _converted(tmp_path)
  edit_one_line(program, "[optax.linear_schedule(0.0, 0.1, 2), optax.cosine_decay_schedule(0.1, 10)]",
                "[optax.linear_schedule(0.0, 0.10001, 2), "
                "optax.cosine_decay_schedule(0.10001, 10)]")
  r = _cli(catalog.NEWEST_LINE, ["check", program, "--against", legacy_recording, "--per-call",
                                 "--calibrate", "--calibrate-with", PROGRAM])
  assert r.returncode == 1, output(r)
  first = next(l for l in r.stdout.splitlines() if l.startswith("first beyond tolerance:"))
  assert first.startswith("first beyond tolerance: site flax_imagenet:train_step, call 1, leaf "
                          "[0].params['Dense_0']['bias']"), first


@pytest.mark.slow
def test_flax_imagenet_end_to_end_still_reports_the_drift(legacy_recording):
  """Without --per-call the whole run is compared against the cross-version bound: the drift
  of three steps fails it, as it did before per-call checking existed."""
  r = _cli(catalog.NEWEST_LINE, ["check", PROGRAM, "--against", legacy_recording])
  assert r.returncode == 1, output(r)
  assert "BEYOND TOLERANCE" in r.stdout and "per-call" not in r.stdout


# numpyro NUTS: the whole chain (warmup and sampling, 8 chains) is one pmap call, so its
# outputs compound every leapfrog step's rounding; `record` steps the loops inside the call
# and `check --per-call` replays them iteration by iteration, each from the recorded state.
NUTS = catalog.PROGRAMS["numpyro_nuts"].path
NUTS_SITE = "numpyro.infer.mcmc:MCMC._single_chain_mcmc"


@pytest.fixture(scope="module")
def nuts_recording(tmp_path_factory) -> tuple[str, int]:
  """numpyro NUTS recorded under legacy jax.pmap on jax 0.6.0, and its iteration count."""
  out = str(tmp_path_factory.mktemp("nuts") / "legacy")
  r = _cli(catalog.LEGACY_LINE, ["record", NUTS, "--out", out])
  assert r.returncode == 0, output(r)
  found = re.search(r"1 of those calls hold loops: ([\d,]+) loop iterations stored", r.stdout)
  assert found, r.stdout
  return out, int(found.group(1).replace(",", ""))


def _converted_numpyro(tmp_path) -> tuple[str, dict]:
  """The program and a copy of jax 0.10.2's numpyro converted by the codemod, and the
  environment that imports that copy."""
  workdir = str(tmp_path / "converted")
  source = subprocess.run(
      [catalog.python_for(catalog.NEWEST_LINE), "-c",
       "import os, numpyro; print(os.path.dirname(numpyro.__file__))"],
      capture_output=True, text=True, check=True).stdout.strip()
  shutil.copytree(source, os.path.join(workdir, "numpyro"),
                  ignore=shutil.ignore_patterns("__pycache__"))
  program = shutil.copy(NUTS, workdir)
  r = subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", "--in-place",
                      "--support-root", workdir, os.path.join(workdir, "numpyro"), program],
                     cwd=venvs.ROOT, capture_output=True, text=True, check=False)
  assert r.returncode == 0 and "2 pmap sites found, 2 converted" in r.stdout + r.stderr, output(r)
  return program, {"PYTHONPATH": os.pathsep.join([workdir, venvs.ROOT])}


def _nuts_check(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
  return subprocess.run([catalog.python_for(catalog.NEWEST_LINE), "-m", "pmap_compat.testing",
                         *args], env=cli_env(env), cwd=venvs.ROOT, capture_output=True,
                        text=True, timeout=TIMEOUT_S, check=False)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pmap", "patched", "codemod"])
def test_numpyro_nuts_checks_per_call_on_jax_0_10_2(nuts_recording, tmp_path, mode):
  """Every leapfrog, tree-building and adaptation iteration of every chain within
  PER_CALL_MAX_ULP (at part scale) of legacy's on jax 0.6.0, with numpyro 0.22 on 0.10.2
  against numpyro 0.19 on 0.6.0, under 0.10.2's own pmap, patched() and the codemod."""
  recording, iterations = nuts_recording
  program, env = _converted_numpyro(tmp_path) if mode == "codemod" else (NUTS, None)
  r = _nuts_check(["check", program, "--against", recording, "--per-call"]
                  + (["--patched"] if mode == "patched" else []), env)
  assert r.returncode == 0, output(r)
  lines = r.stdout.splitlines()
  assert (f"tolerance per call: max {per_call.PER_CALL_MAX_ULP} ulp (elementwise or at leaf "
          "scale) (default across versions: recorded on jax 0.6.0, running jax 0.10.2)") in lines
  assert any(l.startswith(f"  site {NUTS_SITE} (mcmc.py:") and
             l.endswith("called 1 times (recorded run: 1, 1 stored)") for l in lines), r.stdout
  [replayed] = [l for l in lines if "loop iterations replayed" in l]
  assert replayed.startswith(f"      {iterations} loop iterations replayed: "), replayed
  assert lines[-1].startswith("PASS (1 sites reached, 1 recorded calls replayed:"), r.stdout


@pytest.mark.slow
def test_numpyro_perturbed_leapfrog_is_caught_at_its_iteration(nuts_recording, tmp_path):
  """A 0.1% longer position update in numpyro's leapfrog integrator (converted copy): the
  first leapfrog of the first tree of the first sample fails."""
  recording, _ = nuts_recording
  program, env = _converted_numpyro(tmp_path)
  edit_one_line(os.path.join(os.path.dirname(program), "numpyro", "infer", "hmc_util.py"),
                "z + step_size * r_grad", "z + 1.001 * step_size * r_grad")
  r = _nuts_check(["check", program, "--against", recording, "--per-call"], env)
  assert r.returncode == 1, output(r)
  first = next(l for l in r.stdout.splitlines() if l.startswith("first beyond tolerance:"))
  assert re.match(rf"first beyond tolerance: site {re.escape(NUTS_SITE)}, call 0, in its loops: "
                  r"loop \d+ \(while at util\.py:\d+\) iteration \(0, 0, 0\) on device 0, "
                  r"result \d+ float32", first), first


@pytest.mark.slow
def test_numpyro_end_to_end_still_reports_the_drift(nuts_recording):
  recording, _ = nuts_recording
  r = _nuts_check(["check", NUTS, "--against", recording])
  assert r.returncode == 1, output(r)
  assert "BEYOND TOLERANCE" in r.stdout and "per-call" not in r.stdout
