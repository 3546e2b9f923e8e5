"""The user-facing entry points around the equivalence machinery: `make demo` and the
multi-process example's own launcher. Both are end-to-end and heavy, so marked slow."""
import os
import re
import subprocess
import sys

import pytest

import equivalence

pytestmark = pytest.mark.slow


def _env():
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
  env["JAX_PLATFORMS"] = "cpu"
  env.pop("XLA_FLAGS", None)
  return env


def _table_rows(section: str) -> list[str]:
  return [l for l in section.splitlines() if re.match(r"^\w+( \(\d proc\))? +\|", l)]


def test_demo_prints_an_all_identical_table_for_each_jax_line():
  r = subprocess.run([sys.executable, os.path.join(equivalence.TOOLS, "demo.py")],
                     capture_output=True, text=True, cwd=equivalence.ROOT, env=_env(), timeout=1800)
  assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
  legacy_line, newest_line = r.stdout.split("\n== 3. ", 1)
  assert "example | legacy | pmap_compat | codemod exp / jax | identical? | time" in (
      re.sub(r" +\|", " |", legacy_line))
  rows = _table_rows(legacy_line)
  assert len(rows) == len(equivalence.CASES) + 1  # header + one row per case
  assert all(re.search(r"\| yes +\|", l) for l in rows[1:]), "\n".join(rows)
  assert ("example | pmap | codemod jax | codemod = pmap? | pmap vs legacy | "
          "codemod vs legacy | ok?") in re.sub(r" +\|", " |", newest_line)
  rows = _table_rows(newest_line.split("\n== 4. ", 1)[0])
  assert len(rows) == len(equivalence.CASES) + 1
  assert all(l.rstrip().endswith("| yes") for l in rows[1:]), "\n".join(rows)


@pytest.mark.multiprocess
def test_multiprocess_example_launches_two_processes_itself():
  script = os.path.join(equivalence.EXAMPLES, "multiprocess_sgd.py")
  r = subprocess.run([sys.executable, script, "--processes", "2"], capture_output=True,
                     text=True, env=_env(), timeout=300)
  assert r.returncode == 0, r.stdout + r.stderr
  # The launcher prints each process's report file in process order, whole.
  reports = re.findall(r"^process (\d)/2, 4 local of 8 devices\n"
                       r"  \[p\1\] loss per step: (.*)\n"
                       r"  \[p\1\] psum of per-process weights: (.*)$", r.stdout, re.M)
  assert [p for p, _, _ in reports] == ["0", "1"], r.stdout
  (_, loss0, weights0), (_, loss1, weights1) = reports
  # pmean / psum span both processes (each process's own weights would sum differently).
  assert loss0 == loss1 and weights0 == weights1
