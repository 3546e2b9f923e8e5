"""`make demo`: codemod the shipped examples, prove the results unchanged, show dispatch speed.

1. runs the codemod on a temporary copy of examples/ for each target and prints its
   report summary and one representative diff;
2. on jax 0.6.0: runs every example on legacy `jax.pmap`, under `pmap_compat.patched()`,
   and as the codemod rewrote it, each in a fresh process, and compares every output
   bit for bit (tools/equivalence.py, the same machinery as tests/equivalence/);
3. on jax 0.10.2: runs every example as written on 0.10.2's own `jax.pmap` and the
   codemod's `--target jax` output; the two must agree bit for bit where 0.10.2's pmap
   runs the example, and the codemod output must match legacy's recording within
   `pmap_compat.testing`'s cross-version bound;
4. on jax 0.10.2: runs every example as written under `pmap_compat.patched()` (nested
   pmaps included, which 0.10.2's own pmap rejects); it must agree bit for bit with
   0.10.2's own pmap where that runs the example, and match legacy's recording within
   the cross-version bound;
5. prints the dispatch-speed line of bench/pmap_dispatch.py on each JAX line.

Exits 1 if any comparison fails, 0 when every example matches on both JAX lines.
"""
from __future__ import annotations

import collections
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import equivalence as eq  # noqa: E402

BENCH = os.path.join(eq.ROOT, "bench", "pmap_dispatch.py")
SEVERITY = re.compile(r"^\S+:\d+:\d+\s+(ERROR|WARNING|INFO|NOTE|CONVERTED|OK)\b", re.M)
WIDTH = 92


def heading(text: str) -> None:
  print(f"\n== {text} " + "=" * max(0, WIDTH - len(text) - 4))


def report_summary(tree: eq.CodemodTree) -> list[str]:
  """Severity counts and the report's own totals lines."""
  if tree.error:
    return [f"codemod failed: {tree.error}"]
  counts = collections.Counter(SEVERITY.findall(tree.report))
  lines = [", ".join(f"{n} {sev}" for sev, n in sorted(counts.items())) or "no per-site entries"]
  totals = [l.strip() for l in tree.report.splitlines()
            if l.strip() and not SEVERITY.match(l) and re.search(r"\d", l)]
  # One totals line per codemod invocation (files with other flags run apart): add them up.
  templates = {re.sub(r"\d+", "{}", l) for l in totals}
  if len(templates) == 1 and len(totals) > 1:
    sums = [sum(col) for col in zip(*([int(v) for v in re.findall(r"\d+", l)] for l in totals), strict=True)]
    totals = [templates.pop().format(*sums) + f"   (over {len(tree.returncodes)} invocations)"]
  lines += totals[-4:]
  for entry in tree.report.splitlines():  # the entries that need a person, shortened
    found = SEVERITY.match(entry)
    if found and found.group(1) in ("WARNING", "ERROR"):
      where, _, message = entry.partition(f" {found.group(1)} ")
      short = message if len(message) <= 70 else message[:67] + "..."
      lines.append(f"{found.group(1)} {os.path.basename(where)}: {short}")
  for path in sorted(os.listdir(tree.directory)):
    if path.endswith(".py"):
      left = eq.remaining_pmap_uses(os.path.join(tree.directory, path))
      if left:
        lines.append(f"still uses pmap: {', '.join(left)}")
  return lines


def representative_diff(max_lines: int = 70) -> str:
  cmd = eq.codemod_command(["examples/dp_sgd.py"], "--diff", "--target", "experimental")
  proc = subprocess.run(cmd, capture_output=True, text=True, cwd=eq.ROOT, timeout=300, check=False)
  if "Traceback (most recent call last)" in proc.stderr or proc.returncode not in (0, 1):
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return f"(codemod --diff failed, exit {proc.returncode}: {tail})"
  lines = proc.stdout.splitlines()
  if not any(l.startswith(("+", "-")) for l in lines):
    return "(codemod --diff printed no changes for examples/dp_sgd.py)"
  lines = _collapse_added_runs(lines)
  more = len(lines) - max_lines
  return "\n".join(lines[:max_lines] + ([f"... ({more} more lines)"] if more > 0 else []))


def _collapse_added_runs(lines: list[str], head: int = 4, tail: int = 10) -> list[str]:
  """Shortens long runs of added lines (the generated helpers) to their ends, so the
  rewritten call site, which closes the run, stays visible."""
  out: list[str] = []
  run: list[str] = []
  for line in lines + [""]:
    if line.startswith("+") and not line.startswith("+++"):
      run.append(line)
      continue
    if len(run) > head + tail + 1:
      run = run[:head] + [f"+   ... ({len(run) - head - tail} more added lines: generated "
                          "helpers) ..."] + run[-tail:]
    out += run
    run = []
    out.append(line)
  return out[:-1]


def dispatch_line(py: str) -> str:
  """The benchmark's own summary for the tiny chained call and out[0] under the
  interpreter `py`; never a number of ours."""
  if not os.path.exists(BENCH):
    return "bench/pmap_dispatch.py is not present in this checkout: no dispatch numbers to show"
  try:
    helptext = subprocess.run([py, BENCH, "--help"], capture_output=True, text=True,
                              timeout=120, check=False).stdout
    cmd = [py, BENCH] + (["--quick"] if "--quick" in helptext else []) + (
        ["--cases", "1,8"] if "--cases" in helptext else [])  # the tiny chained call, out[0]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False,
                          cwd=eq.ROOT)
  except subprocess.TimeoutExpired:
    return "bench/pmap_dispatch.py did not finish within 300 s: no dispatch numbers to show"
  out = proc.stdout.splitlines()
  picked = [l for l in out if l.lower().startswith("dispatch")] or (
      [l for l in out if l.startswith("| case")] + [l for l in out if "tiny" in l])
  if proc.returncode != 0 or not any("tiny" in l or l.lower().startswith("dispatch")
                                     for l in picked):
    tail = (proc.stderr.strip().splitlines() or ["no summary line"])[-1]
    return f"bench/pmap_dispatch.py gave no dispatch line (exit {proc.returncode}: {tail})"
  notes = [l for l in out if l.startswith("note:")]
  shown = " ".join(os.path.relpath(c, eq.ROOT) if os.path.isabs(c) else c for c in cmd)
  return "\n".join([f"$ {shown}"] + picked + notes)


def cell(c: eq.Comparison | None, result: eq.RunResult) -> str:
  if not result.ok:
    return "FAILED"
  if c is not None and not c.identical:
    return "DIFFERS"
  return f"{result.seconds:.2f}s"


def verdict_cell(c: eq.Comparison | None) -> str:
  if c is None:
    return "n/a"
  if c.identical:
    return "identical"
  return f"{c.worst_ulp:.2g} ulp" if c.ok else "NO"


def print_table(header: tuple[str, ...], rows: list[tuple]) -> None:
  widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
  fmt = " | ".join(f"{{:<{w}}}" for w in widths)
  print(fmt.format(*header))
  print("-+-".join("-" * w for w in widths))
  for r in rows:
    print(fmt.format(*r))


def print_reasons(failures: list[tuple[str, str, str]]) -> None:
  by_reason = collections.defaultdict(list)
  for name, what, message in failures:
    by_reason[(what, message)].append(name)
  for (what, message), names in by_reason.items():
    which = "all examples" if len(names) == len(eq.CASES) else ", ".join(names)
    print(f"  {what} on {which}: {message}")


def legacy_line(runner: eq.Runner) -> list[tuple[str, str, str]]:
  """The jax 0.6.0 table; returns the failed comparisons."""
  rows, failures, shown = [], [], []
  for case in eq.CASES:
    legacy = runner.result(case, "legacy")
    verdicts = {m: runner.compare(case, m) for m in eq.LEGACY_LINE}
    # A difference within the case's documented codemod bound (XLA:CPU contracting
    # differently on some hosts) is shown with its reason, not counted as a failure.
    differ = [m for m, v in verdicts.items() if not v.identical]
    bad = [m for m in differ if not verdicts[m].ok]
    failures += [(case.name, m, verdicts[m].message) for m in bad]
    shown += [(case.name, m, verdicts[m].message) for m in differ]
    codemod = " / ".join(cell(verdicts[m], runner.result(case, m))
                         for m in ("codemod-experimental", "codemod-jax"))
    label = case.name + (f" ({case.processes} proc)" if case.processes > 1 else "")
    total = legacy.seconds + sum(v.seconds for v in verdicts.values())
    rows.append((label, cell(None, legacy), cell(verdicts["pmap_compat"],
                 runner.result(case, "pmap_compat")), codemod,
                 "NO" if bad or not legacy.ok else "within bound" if differ else "yes",
                 f"{total:.2f}s"))
  print_table(("example", "legacy", "pmap_compat", "codemod exp / jax", "identical?", "time"), rows)
  print("(times: wall time of each example's run(), compile included; 'time' sums the "
        "four modes; 'within bound': the example's documented codemod bound, "
        "tools/equivalence.py)")
  print_reasons(shown)
  return failures


def newest_line(runner: eq.Runner) -> list[tuple[str, str, str]]:
  """The jax 0.10.2 table; returns the failed comparisons (0.10.2's own pmap failing to
  run an example is shown, not counted: the codemod output is what runs there)."""
  rows, failures, pmap_failures = [], [], []
  for case in eq.CASES:
    pmap, codemod = runner.result(case, eq.NEWEST_PMAP), runner.result(case, eq.NEWEST_CODEMOD)
    verdicts = {v.against: v for v in runner.newest_line(case)}
    pmap_vs_legacy = runner.compare(case, eq.NEWEST_PMAP) if pmap.ok else None
    if not pmap.ok:
      pmap_failures.append((case.name, f"jax {eq.NEWEST_JAX}'s pmap", pmap.error))
    bad = [v for v in verdicts.values() if not v.ok] + (
        [pmap_vs_legacy] if pmap_vs_legacy and not pmap_vs_legacy.ok else [])
    failures += [(case.name, f"{v.mode} vs {v.against}", v.message) for v in bad]
    label = case.name + (f" ({case.processes} proc)" if case.processes > 1 else "")
    rows.append((label, cell(None, pmap), cell(None, codemod),
                 verdict_cell(verdicts.get(eq.NEWEST_PMAP)), verdict_cell(pmap_vs_legacy),
                 verdict_cell(verdicts["legacy"]) if codemod.ok else "n/a",
                 "yes" if not bad and codemod.ok else "NO"))
  print_table(("example", "pmap", "codemod jax", "codemod = pmap?", "pmap vs legacy",
               "codemod vs legacy", "ok?"), rows)
  from pmap_compat.testing import CROSS_VERSION_MAX_ULP  # pylint: disable=import-outside-toplevel
  print(f"('vs legacy': against legacy jax.pmap on jax 0.6.0, allowed up to "
        f"{CROSS_VERSION_MAX_ULP} ulp across versions; 'N ulp' is the largest difference, in "
        "ulp of the leaf's largest value)")
  print_reasons(pmap_failures + failures)
  return failures


def patched_line(runner: eq.Runner) -> list[tuple[str, str, str]]:
  """The jax 0.10.2 table for the examples as written under pmap_compat.patched();
  returns the failed comparisons."""
  rows, failures = [], []
  for case in eq.CASES:
    result = runner.result(case, eq.NEWEST_PATCHED)
    label = case.name + (f" ({case.processes} proc)" if case.processes > 1 else "")
    verdicts = {v.against: v for v in runner.newest_line(case, eq.NEWEST_PATCHED)}
    bad = [v for v in verdicts.values() if not v.ok]
    failures += [(case.name, f"{v.mode} vs {v.against}", v.message) for v in bad]
    pmap_ran = runner.result(case, eq.NEWEST_PMAP).ok
    rows.append((label, cell(None, result),
                 verdict_cell(verdicts.get(eq.NEWEST_PMAP)) if pmap_ran else "pmap fails",
                 verdict_cell(verdicts["legacy"]) if result.ok else "n/a",
                 "yes" if not bad and result.ok else "NO"))
  print_table(("example", "pmap_compat", "= jax.pmap?", "vs legacy", "ok?"), rows)
  print("('= jax.pmap?': bit for bit against 0.10.2's own jax.pmap where that runs the "
        "example; 'vs legacy' as above)")
  print_reasons(failures)
  return failures


def main() -> int:
  import jax
  start = time.perf_counter()
  print(f"pmap-compat demo: jax {jax.__version__} and jax {eq.NEWEST_JAX}, python "
        f"{sys.version.split()[0]}, {len(eq.CASES)} example runs x {len(eq.MODES)} modes")
  with tempfile.TemporaryDirectory(prefix="pmap-demo-") as tmp:
    runner = eq.Runner(tmp)

    heading("1. codemod on a temporary copy of examples/")
    for target in ("experimental", "jax"):
      print(f"$ python -m codemod.pmap_to_shmap examples/*.py --target {target} --in-place "
            "--report REPORT")
      for line in report_summary(runner.codemod_tree(target)):
        print(f"    {line}")
    print("\nrepresentative diff (python -m codemod.pmap_to_shmap examples/dp_sgd.py "
          "--diff --target experimental):")
    print(representative_diff())

    jobs = [(c, m) for c in eq.CASES for m in eq.MODES]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
      list(pool.map(lambda job: runner.result(*job), jobs))
    heading(f"2. jax {jax.__version__}: every output compared bit for bit with legacy jax.pmap")
    failures = legacy_line(runner)
    heading(f"3. jax {eq.NEWEST_JAX}: its own jax.pmap and the codemod output (--target jax)")
    failures += newest_line(runner)
    heading(f"4. jax {eq.NEWEST_JAX}: every example as written, under pmap_compat.patched()")
    failures += patched_line(runner)

    heading("5. dispatch speed on both JAX lines")
    for python in (sys.executable, eq.python_for(eq.NEWEST_PMAP)):
      print(dispatch_line(python))

  heading("result")
  if failures:
    print(f"{len(failures)} comparisons differ or failed ({time.perf_counter() - start:.0f}s)")
    return 1
  print(f"all {len(eq.CASES)} examples match in every mode that runs them, on both JAX lines "
        f"({time.perf_counter() - start:.0f}s)")
  return 0


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.exit(main())
