"""Runs JAX's own shard_map / pmap suites of one release twice, with JAX's implementation
and with ours substituted, and compares the outcomes.

The suites are the unmodified files under ../shared/jax_tests/vX.Y.Z; each run happens in
a temporary copy of that folder (JAX's conftest.py and pyproject pytest configuration
rule it, not ours), in the release's environment, with 8 CPU devices and
`-p jax_suite_plugin` (substitution, internal_test_util, outcomes as JSON).

    .venv/bin/python tests/conformance/jax_suites.py 0.6.0 0.10.2 [--suite shard_map] [-n 2]

Where a baseline of JAX's own outcomes exists, JAX's implementation runs only the cases
ours does not pass and the listed ones (`run_release`), which is all the verdict reads;
`--full` runs it on the whole suite.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from known_failures import known_failures, not_applicable  # this folder (on sys.path)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
JAX_TESTS = os.path.join(os.path.dirname(ROOT), "shared", "jax_tests")
LEGACY = "0.6.0"
NEWEST = "0.10.2"
# Every release from 0.6.0 to the newest with an environment (`make venvs`) and suites.
RELEASES = ("0.6.0", "0.6.2", "0.7.0", "0.7.2", "0.8.0", "0.8.2", "0.9.0", "0.9.2",
            "0.10.0", NEWEST)
SUITES = ("shard_map", "pmap")
IMPLS = ("jax", "ours")
# JAX's own outcomes recorded by the suites' provider: (release, suite) -> file.
BASELINES = {
  ("0.6.0", "shard_map"): "v0.6.0_shard_map_jax_experimental.txt",
  ("0.6.0", "pmap"): "v0.6.0_pmap_legacy.txt",
  ("0.8.2", "shard_map"): "v0.8.2_shard_map_jax.txt",
  ("0.9.2", "shard_map"): "v0.9.2_shard_map_jax.txt",
  ("0.9.2", "pmap"): "v0.9.2_pmap_legacy_flag.txt",  # JAX_PMAP_SHMAP_MERGE=false, as run
  ("0.10.2", "shard_map"): "v0.10.2_shard_map_jax.txt",
  ("0.10.2", "pmap"): "v0.10.2_pmap_jax.txt",
}
# More baseline mismatches than this fail the comparison (a few are timing-dependent).
BASELINE_TOLERANCE = 3
TIMEOUT_S = 1500
# Fewer cases than twice this run in one process: starting workers costs more.
_CASES_PER_WORKER = 40


def python_for(release: str) -> str:
  venv = os.path.join(ROOT, ".venv" if release == LEGACY else f".venv-jax{release}")
  if not os.path.exists(os.path.join(venv, ".installed")):
    raise RuntimeError(f"no jax {release} environment at {venv}; run `make venvs`")
  return os.path.join(venv, "bin", "python")


def case_name(nodeid: str) -> str:
  """`tests/shard_map_test.py::Class::test` -> `Class::test` (the baselines' form)."""
  return nodeid.split("::", 1)[1] if "::" in nodeid else nodeid


class Run(NamedTuple):
  outcomes: dict[str, str]  # Class::test -> passed | failed | skipped | error
  messages: dict[str, str]  # Class::test -> the failure's crash line
  seconds: float
  tail: str  # the end of pytest's output, for reports


def run_suite(release: str, suite: str, impl: str, *, workers: int = 2,
              extra: tuple[str, ...] = (), cases: list[str] | None = None) -> Run:
  """JAX's `suite` of `release` under `impl` ("jax" or "ours"), in a temporary rootdir;
  only `cases` (`Class::name`) when given."""
  source = os.path.join(JAX_TESTS, f"v{release}")
  with tempfile.TemporaryDirectory(prefix=f"jax-{release}-{suite}-{impl}-") as tmp:
    for name in ("conftest.py", "pyproject.toml"):
      shutil.copy(os.path.join(source, name), tmp)
    os.mkdir(os.path.join(tmp, "tests"))
    shutil.copy(os.path.join(source, "tests", f"{suite}_test.py"), os.path.join(tmp, "tests"))
    out = os.path.join(tmp, "outcomes.json")
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    env.update(PYTHONPATH=HERE, JAX_PLATFORMS="cpu", CONFORMANCE_IMPL=impl,
               XLA_FLAGS="--xla_force_host_platform_device_count=8",
               CONFORMANCE_OUT=out,
               CONFORMANCE_INTERNAL_TEST_UTIL=os.path.join(source, "internal_test_util"))
    if suite == "pmap":
      # pmap_compat keeps legacy pmap's semantics wherever the release ships legacy's
      # runtime, which 0.8 and 0.9 run only with this flag off (their default is on;
      # releases without the flag ignore it). JAX's own runs with it too, as the 0.9.2
      # baseline was recorded.
      env["JAX_PMAP_SHMAP_MERGE"] = "false"
    targets = ([f"tests/{suite}_test.py::{case}" for case in cases] if cases is not None
               else [f"tests/{suite}_test.py"])
    args = [python_for(release), "-m", "pytest", "-p", "jax_suite_plugin",
            "-p", "no:cacheprovider", "-q", "--rootdir", tmp, "-c",
            os.path.join(tmp, "pyproject.toml"), *targets]
    if workers > 1 and (cases is None or len(cases) > 2 * _CASES_PER_WORKER):
      args += ["-n", str(workers)]
    start = time.monotonic()
    proc = subprocess.run([*args, *extra], cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    seconds = time.monotonic() - start
    tail = (proc.stdout + proc.stderr)[-3000:]
    if not os.path.exists(out):
      raise RuntimeError(f"jax {release} {suite} ({impl}) wrote no outcomes:\n{tail}")
    with open(out) as f:
      raw = json.load(f)
  outcomes, messages = raw.get("outcomes", raw), raw.get("messages", {})
  return Run({case_name(k): v for k, v in outcomes.items()},
             {case_name(k): v for k, v in messages.items()}, seconds, tail)


def read_baseline(release: str, suite: str) -> dict[str, str] | None:
  name = BASELINES.get((release, suite))
  if name is None:
    return None
  outcomes = {}
  with open(os.path.join(JAX_TESTS, "baselines", name)) as f:
    for line in f:
      if line.strip() and not line.startswith("#"):
        outcome, case = line.rstrip("\n").split("\t")
        # `tests.shard_map_test.Class::name` -> `Class::name`; some parametrized names
        # there carry a stray closing bracket.
        case = re.sub(r"^tests\.\w+\.", "", case)
        if case.count("]") > case.count("["):
          case = case[:-1]
        outcomes[case] = outcome
  return outcomes


@dataclass
class Comparison:
  release: str
  suite: str
  jax_passed: int = 0
  ours_passed: int = 0
  total: int = 0
  regressions: list[str] = field(default_factory=list)  # JAX passes, ours not, not listed
  known: list[str] = field(default_factory=list)  # known failures that still fail
  fixed: list[str] = field(default_factory=list)  # known failures that now pass
  stale: list[str] = field(default_factory=list)  # listed cases JAX itself does not pass
  not_applicable: list[str] = field(default_factory=list)
  baseline_mismatches: list[str] = field(default_factory=list)
  collection_errors: list[str] = field(default_factory=list)  # "impl: module"
  seconds: dict[str, float] = field(default_factory=dict)

  def problems(self) -> list[str]:
    out = [f"collection error ({c}): its cases did not run" for c in self.collection_errors]
    if not self.jax_passed:
      out.append("JAX's own implementation passed nothing: the suite did not run")
    out += [f"regressed (JAX's passes, ours does not): {c}" for c in self.regressions]
    out += [f"known failure now passes, remove it from the list: {c}" for c in self.fixed]
    out += [f"listed but JAX's own does not pass it: {c}" for c in self.stale]
    if len(self.baseline_mismatches) > BASELINE_TOLERANCE:
      out += [f"JAX's own outcome differs from the baseline: {c}"
              for c in self.baseline_mismatches]
    return out

  def report(self) -> str:
    """The summary, then every listed, not-applicable and baseline-mismatched case."""
    known = known_failures(self.release, self.suite)
    unfit = not_applicable(self.release, self.suite)
    lines = [self.summary(), *(f"  {p}" for p in self.problems())]
    lines += [f"  {c}: {known[c]}" for c in self.known]
    lines += [f"  {c}: {unfit[c]}" for c in self.not_applicable]
    lines += [f"  baseline mismatch {m}" for m in self.baseline_mismatches[:20]]
    if len(self.baseline_mismatches) > 20:
      lines.append(f"  ... and {len(self.baseline_mismatches) - 20} more baseline mismatches")
    return "\n".join(lines)

  def summary(self) -> str:
    times = ", ".join(f"{k} {v:.0f} s" for k, v in self.seconds.items())
    return (f"jax {self.release} {self.suite}_test.py: {self.total} cases; JAX's own passed "
            f"{self.jax_passed}, ours {self.ours_passed}; known failures {len(self.known)}, "
            f"not applicable {len(self.not_applicable)}, regressions {len(self.regressions)}, "
            f"baseline mismatches {len(self.baseline_mismatches)} ({times})")


def compare(release: str, suite: str, jax_run: Run, ours_run: Run) -> Comparison:
  known = known_failures(release, suite)
  unfit = not_applicable(release, suite)
  jax_out, ours_out = jax_run.outcomes, ours_run.outcomes
  c = Comparison(release, suite, seconds={"jax": jax_run.seconds, "ours": ours_run.seconds})
  c.total = len(jax_out)
  c.jax_passed = sum(v == "passed" for v in jax_out.values())
  c.ours_passed = sum(v == "passed" for v in ours_out.values())
  c.collection_errors = [f"{impl}: {case}" for impl, run in (("jax", jax_run), ("ours", ours_run))
                         for case, outcome in run.outcomes.items() if outcome == "error"]
  for case, outcome in sorted(jax_out.items()):
    ours = ours_out.get(case, "missing")
    if case in unfit:
      c.not_applicable.append(case)
    elif case in known:
      if outcome != "passed":
        c.stale.append(case)
      elif ours == "passed":
        c.fixed.append(case)
      else:
        c.known.append(case)
    elif outcome == "passed" and ours != "passed":
      message = ours_run.messages.get(case, "")
      c.regressions.append(f"{case} ({ours}{': ' + message if message else ''})")
  c.stale += sorted(set(known) - set(jax_out))
  baseline = read_baseline(release, suite)
  if baseline is not None:
    for case in sorted(set(baseline) | set(jax_out)):
      want, got = baseline.get(case, "missing"), jax_out.get(case, "missing")
      if want != got:
        c.baseline_mismatches.append(f"{case}: baseline {want}, this run {got}")
  return c


def run_release(release: str, suite: str, *, workers: int = 2,
                focused: bool = True) -> Comparison:
  """Both implementations on `release`'s `suite`, compared. `focused`, where a baseline
  of JAX's own outcomes exists: ours runs the whole suite and JAX's own runs every case
  ours does not pass (and every listed one), which is all the verdict reads; elsewhere the
  baseline stands in for JAX's outcome, in the counts only."""
  ours = run_suite(release, suite, "ours", workers=workers)
  baseline = read_baseline(release, suite) if focused else None
  if baseline is None:
    return compare(release, suite, run_suite(release, suite, "jax", workers=workers), ours)
  listed = set(known_failures(release, suite)) | set(not_applicable(release, suite))
  # Listed cases missing from ours' run (not collected there) are left to JAX's full
  # outcome below, as `compare` reports them.
  wanted = sorted({case for case, outcome in ours.outcomes.items() if outcome != "passed"}
                  | (listed & set(ours.outcomes)))
  jax_run = (run_suite(release, suite, "jax", workers=workers, cases=wanted) if wanted
             else Run({}, {}, 0.0, ""))
  outcomes = {case: outcome for case, outcome in baseline.items() if case in ours.outcomes}
  outcomes.update(jax_run.outcomes)
  return compare(release, suite, jax_run._replace(outcomes=outcomes), ours)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("releases", nargs="*", default=[LEGACY, NEWEST])
  parser.add_argument("--suite", choices=SUITES, action="append")
  parser.add_argument("-n", "--workers", type=int, default=2)
  parser.add_argument("--save", help="folder to write each run's outcomes to (JSON)")
  parser.add_argument("--full", action="store_true",
                      help="run JAX's own implementation on the whole suite too (it runs "
                           "the cases ours does not pass by default, where a baseline exists)")
  args = parser.parse_args()
  failed = False
  for release in args.releases:
    for suite in args.suite or SUITES:
      if not (args.full or args.save):
        c = run_release(release, suite, workers=args.workers)
        print(c.report(), flush=True)
        failed |= bool(c.problems())
        continue
      runs = {impl: run_suite(release, suite, impl, workers=args.workers) for impl in IMPLS}
      if args.save:
        os.makedirs(args.save, exist_ok=True)
        for impl, run in runs.items():
          with open(os.path.join(args.save, f"{release}_{suite}_{impl}.json"), "w") as f:
            json.dump(run._asdict(), f, indent=0, sort_keys=True)
      c = compare(release, suite, runs["jax"], runs["ours"])
      print(c.report(), flush=True)
      failed |= bool(c.problems())
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
