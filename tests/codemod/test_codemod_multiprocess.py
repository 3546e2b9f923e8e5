"""Multi-host safety: a 2-process job (jax.distributed + gloo over 127.0.0.1, 4 CPU devices
per process) runs a pmap program as written under legacy jax.pmap, as converted without
--multihost, and as converted with it. Without the flag the converted site must raise an
error naming --multihost (never reduce over one host's devices only); with it, each
process passes and gets back host-local arrays and the result equals legacy's bit for
bit. Bounded: the job is killed after TIMEOUT seconds."""
import contextlib
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from codemod import support_module
from codemod_testing import rewrite

WORKER = os.path.join(os.path.dirname(__file__), "mp_worker.py")
TIMEOUT = 150
PROGRAM = '''\
import jax
import numpy as np


@jax.pmap
def no_name(x):
  return x * 2


def run():
  n = jax.local_device_count()
  x = np.arange(n * 3, dtype=np.float32).reshape(n, 3) + 100 * jax.process_index()
  total = jax.pmap(lambda v: (jax.lax.psum(v, "i"), jax.lax.axis_index("i")), "i")(x)
  return np.concatenate([total[0], total[1][:, None].astype(np.float32), no_name(x)], axis=1)
'''


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _finish(procs: list, deadline: float) -> None:
  """Lets the processes run until the deadline, then kills any still running."""
  for p in procs:
    with contextlib.suppress(subprocess.TimeoutExpired):
      p.wait(timeout=max(1, deadline - time.monotonic()))
  for p in [p for p in procs if p.poll() is None]:
    p.kill()
    p.wait()


@pytest.fixture(scope="module")
def job(tmp_path_factory):
  programs = tmp_path_factory.mktemp("programs")
  (programs / "legacy.py").write_text(PROGRAM)
  (programs / "converted_default.py").write_text(rewrite(PROGRAM, target="experimental")[0])
  (programs / "converted_multihost.py").write_text(
      rewrite(PROGRAM, target="experimental", multihost=True)[0])
  support_module.write(str(programs), support_module.DEFAULT_NAME)
  port = _free_port()
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.dirname(WORKER)))
  results = [programs / f"result{pid}.json" for pid in range(2)]
  logs = [programs / f"worker{pid}.log" for pid in range(2)]
  procs = []
  for pid, (result, log) in enumerate(zip(results, logs, strict=True)):
    with open(log, "w") as out:
      procs.append(subprocess.Popen(
          [sys.executable, WORKER, str(pid), str(port), str(programs), str(result)],
          stdout=out, stderr=subprocess.STDOUT, env=env))
  _finish(procs, time.monotonic() + TIMEOUT)
  text = "\n".join(f"--- process {pid} (rc={p.returncode}) ---\n{log.read_text()[-3000:]}"
                   for pid, (p, log) in enumerate(zip(procs, logs, strict=True)))
  found = [json.loads(r.read_text()) if r.exists() else None for r in results]
  assert all(f is not None for f in found), text
  return found


@pytest.mark.multiprocess
def test_converted_without_multihost_raises_naming_the_fix(job):
  for pid, results in enumerate(job):
    error = results["converted_default"].get("error", "")
    assert "RuntimeError" in error and "--multihost" in error, (pid, results)


@pytest.mark.multiprocess
def test_converted_with_multihost_matches_legacy_on_every_process(job):
  for pid, results in enumerate(job):
    legacy = results["legacy"]
    assert "error" not in legacy, (pid, legacy)
    assert results["converted_multihost"] == legacy, pid
  # The collectives spanned both processes: their psums agree although their inputs differ.
  assert job[0]["legacy"]["value"][0][:3] == job[1]["legacy"]["value"][0][:3]
