"""Real third-party pmap programs, unchanged, under every way of moving them off legacy pmap.

Each program (programs/*.py: numpyro NUTS with parallel chains, brax PPO on all 8 devices
and on 2 through its `max_devices_per_host`, brax ARS on 2 that way, the Flax ImageNet
example's loop) runs in its own fresh interpreter of a real-programs environment
(`.venv-real-jax<line>`, built by make from .ci/real-programs-jax<line>.txt) through
run_mode.py, once per mode (program_catalog.py). On jax 0.6.0 every mode must give legacy
`jax.pmap`'s results bit for bit; on jax 0.10.2 every mode must give that release's own
`jax.pmap`'s (where that cannot run the library, catalog.PLAIN_FAILS, the modes agree with
each other). Every mode must also compile each step function once, as legacy pmap does, and
really run ours: `patched()` modes build pmaps through pmap_compat, the codemod mode runs the
converted copy of the library, and on 0.6.0 neither touches legacy pmap's compile path.

The numpyro case at its smallest settings, in the cheapest modes, runs in `make test`; the
rest is slow (`make test-all`). Runs are cached per test session (one per line, program, mode).
With -n, each program's cases on one line go to one worker (xdist_group), sharing its runs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import program_catalog as catalog  # noqa: E402
import outcomes  # noqa: E402

# The smallest settings that still take every path (warmup adaptation, several PPO epochs
# with an evaluation, train steps after replicate and an eval step). numpyro runs fewer
# chains than the 8 devices: pmap maps them over the first 4, as it chose by rows.
KWARGS = {
    "numpyro_nuts": {"num_warmup": 10, "num_samples": 10, "num_chains": 4},
    "brax_ppo": {},
    "brax_ppo_two_devices": {"max_devices_per_host": 2},
    "brax_ars_two_devices": {"max_devices_per_host": 2},
    "flax_imagenet": {},
    "flax_nnx_pmap": {},
}
TIMEOUT_S = 1800

# (line, program, mode) cases that run in `make test`.
FAST = {(catalog.LEGACY_LINE, "numpyro_nuts", "legacy"),
        (catalog.LEGACY_LINE, "numpyro_nuts", "patched_before"),
        (catalog.LEGACY_LINE, "numpyro_nuts", "patched_after"),
        # A library's own pmap wrapper (nnx.pmap) converted by the codemod, run unchanged.
        (catalog.LEGACY_LINE, "flax_nnx_pmap", "legacy"),
        (catalog.LEGACY_LINE, "flax_nnx_pmap", "codemod")}

# How jax 0.10.2's own pmap names every program it compiles.
JAX_PMAP_COMPILE = "jit(_fun)"
# JAX's own behaviour, not ours: the compile-count check cannot attribute its compiles.
JAX_PMAP_NAMES = ("jax 0.10.2's own jax.pmap compiles every pmapped function as `_fun`, so its "
                  "compiles cannot be attributed to the step functions")

# Known failures, each the exact case and why; strict, so a fix shows up as XPASS.
KNOWN: dict[tuple[str, str, str, str], str] = {}


class RealRuns:
  """Runs (line, program, mode) once per test session and keeps the outcome.

  With `reuse`, a run that `root` already holds (from an earlier session or from
  `run_mode.py ... ROOT/LINE/PROGRAM/MODE`) is read instead of run again."""

  def __init__(self, root: str, reuse: bool = False):
    self.root = root
    self.reuse = reuse
    self._runs: dict[tuple[str, str, str], outcomes.Run | str] = {}

  def get(self, line: str, program: str, mode: str) -> outcomes.Run:
    key = (line, program, mode)
    if key not in self._runs:
      self._runs[key] = self._run(*key)
    run = self._runs[key]
    if isinstance(run, str):
      pytest.fail(run)
    return run

  def _run(self, line: str, program: str, mode: str) -> outcomes.Run | str:
    python = catalog.python_for(line)
    out_dir = os.path.join(self.root, line, program, mode)
    if self.reuse and os.path.exists(os.path.join(out_dir, "run.json")):
      return outcomes.load(out_dir)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    cmd = [python, os.path.join(catalog.HERE, "run_mode.py"), program, mode, out_dir,
           "--kwargs", json.dumps(KWARGS[program])]
    done = subprocess.run(cmd, env=env, cwd=catalog.ROOT, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    if done.returncode != 0:
      return (f"{program} in mode {mode} on jax {line} failed (exit {done.returncode}):\n"
              f"{' '.join(cmd)}\n{done.stderr[-6000:]}")
    return outcomes.load(out_dir)


@pytest.fixture(scope="session")
def real_runs(tmp_path_factory) -> RealRuns:
  """REAL_PROGRAMS_OUT=DIR keeps every run's files there (outcomes.py reads them);
  REAL_PROGRAMS_REUSE=1 with it reads the runs DIR already has instead of running them."""
  out = os.environ.get("REAL_PROGRAMS_OUT")
  return RealRuns(out or str(tmp_path_factory.mktemp("real_programs")),
                  reuse=bool(out) and os.environ.get("REAL_PROGRAMS_REUSE") == "1")


def _skip_without_release(line: str, program: catalog.Program) -> None:
  skipped = catalog.skipped_libraries(line)
  for name in program.distributions:
    if name in skipped:
      pytest.skip(f"{name} has no release for jax {line}: {skipped[name]}")


def _cases(check: str):
  for line in catalog.REFERENCE:
    for program in catalog.PROGRAMS:
      reference = catalog.reference_mode(line, program)
      for mode in (catalog.REFERENCE[line],) + catalog.CONVERTED:
        if check == "results" and mode in (reference, catalog.REFERENCE[line]):
          continue
        marks = [pytest.mark.xdist_group(f"real-{line}-{program}")]
        if (line, program, mode) not in FAST:
          marks.append(pytest.mark.slow)
        reason = KNOWN.get((line, program, mode, check))
        if check == "compiles" and mode == "jax_pmap" and catalog.PROGRAMS[program].pmapped_steps:
          reason = JAX_PMAP_NAMES
        if mode != reference and mode == catalog.REFERENCE[line]:
          reason = catalog.PLAIN_FAILS[line, program][1]
        if reason:
          marks.append(pytest.mark.xfail(strict=True, reason=reason))
        yield pytest.param(line, program, mode, marks=marks, id=f"jax{line}-{program}-{mode}")


@pytest.mark.parametrize("line,program,mode", list(_cases("results")))
def test_results_match_the_reference_bit_for_bit(real_runs, line, program, mode):
  _skip_without_release(line, catalog.PROGRAMS[program])
  reference_mode = catalog.reference_mode(line, program)
  reference = real_runs.get(line, program, reference_mode)
  run = real_runs.get(line, program, mode)
  _assert_ours_ran(run, line)
  comparison = outcomes.compare(reference, run)
  assert comparison.identical, (
      f"{program} on jax {line}: {mode} vs {reference_mode}: {comparison.describe()}")


@pytest.mark.parametrize("line,program,mode", list(_cases("compiles")))
def test_each_step_function_compiles_as_legacy_did(real_runs, line, program, mode):
  _skip_without_release(line, catalog.PROGRAMS[program])
  run = real_runs.get(line, program, mode)
  if mode in catalog.CONVERTED:
    _assert_ours_ran(run, line)
  steps = run.step_compiles()
  print(f"{program} on jax {line}, {mode}: step compiles {steps}; "
        f"all compiles {run.info['compiles']}")
  once = catalog.PROGRAMS[program].compiles
  assert steps == dict.fromkeys(steps, once), (
      f"{program} on jax {line}, {mode}: compiles per step function {steps} (legacy pmap: "
      f"{once} each); every compile: {run.info['compiles']}")


def _assert_ours_ran(run: outcomes.Run, line: str) -> None:
  """The mode really took the converted path: otherwise a bit-identical result proves nothing."""
  mode = run.info["mode"]
  if mode in ("patched_before", "patched_after"):
    assert run.info["pmap_compat_pmaps"], (
        f"{mode}: the program ran without building any pmap through pmap_compat "
        "(patched() did not reach the library's pmap)")
  if mode == "codemod":
    # Sites the codemod reports and leaves alone are fine while the program does not reach
    # them: the checks below catch a run through JAX's pmap.
    totals = run.codemod_totals()
    assert totals is not None and totals[1] > 0, (
        f"codemod converted no pmap site (found, converted, reported, errors = {totals}):\n"
        f"{run.info['codemod_report']}")
    for package, path in run.info["library_files"]:
      assert path and "site-packages" not in path, f"{package} imported from {path}, not converted"
  if mode in catalog.CONVERTED and line == catalog.LEGACY_LINE:
    assert not run.info["legacy_pmap_compiles"], (
        f"{mode}: legacy pmap still compiled {run.info['legacy_pmap_compiles']}")
  if mode in catalog.CONVERTED and line == catalog.NEWEST_LINE:
    own = run.info["compiles"].get(JAX_PMAP_COMPILE)
    assert not own, f"{mode}: jax {line}'s own pmap still compiled {own} program(s)"
