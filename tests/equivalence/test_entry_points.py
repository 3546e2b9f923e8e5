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


def test_demo_prints_an_all_identical_table():
  r = subprocess.run([sys.executable, os.path.join(equivalence.TOOLS, "demo.py")],
                     capture_output=True, text=True, cwd=equivalence.ROOT, env=_env(), timeout=1500)
  assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
  assert "example | legacy | pmap_compat | codemod exp / jax | identical? | time" in (
      re.sub(r" +\|", " |", r.stdout))
  rows = [l for l in r.stdout.splitlines() if re.match(r"^\w+( \(\d proc\))? +\|", l)]
  assert len(rows) == len(equivalence.CASES) + 1  # header + one row per case
  assert all(re.search(r"\| yes +\|", l) for l in rows[1:]), "\n".join(rows)


@pytest.mark.multiprocess
def test_multiprocess_example_launches_two_processes_itself():
  script = os.path.join(equivalence.EXAMPLES, "multiprocess_sgd.py")
  r = subprocess.run([sys.executable, script, "--processes", "2"], capture_output=True,
                     text=True, env=_env(), timeout=300)
  assert r.returncode == 0, r.stdout + r.stderr
  assert "process 0/2, 4 local of 8 devices" in r.stdout
  assert "process 1/2, 4 local of 8 devices" in r.stdout
  losses = sorted(l.split(":", 1)[1] for l in r.stdout.splitlines() if "loss per step" in l)
  assert len(losses) == 2 and losses[0] == losses[1]  # pmean spans both processes
