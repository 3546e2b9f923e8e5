"""Row 23: a 2-process x 4-CPU-device job over 127.0.0.1 (jax.distributed + gloo).

Each process passes its host-local slice exactly as with legacy pmap; collectives
span both processes; out_axes=None, in_axes=None, typed keys, donation, static args,
chaining our own outputs, mixing with legacy pmap and pmap under jit are compared
against legacy ``jax.pmap`` run the same way (see mp/worker.py). Bounded: the job
is killed after TIMEOUT seconds and the test fails with both processes' logs.
"""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

WORKER = os.path.join(os.path.dirname(__file__), "mp", "worker.py")
NPROC, LOCAL = 2, 4
TIMEOUT = 150
EXPECTED = ["p_psum_and_index", "p_collectives", "p_broadcast_in_and_out",
            "p_pytree_and_kwargs", "p_chained_outputs", "p_static_argument", "p_donation",
            "p_typed_keys", "p_legacy_outputs_in", "p_outputs_into_legacy", "p_under_jit",
            "global_under_jit"]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_job(tmp_path):
  port = _free_port()
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  procs, logs, results = [], [], []
  for pid in range(NPROC):
    log = open(tmp_path / f"worker{pid}.log", "w+")
    result = tmp_path / f"result{pid}.json"
    procs.append(subprocess.Popen(
        [sys.executable, WORKER, str(pid), str(NPROC), str(port), str(result), str(LOCAL)],
        stdout=log, stderr=subprocess.STDOUT, env=env))
    logs.append(log)
    results.append(result)
  deadline = time.monotonic() + TIMEOUT
  timed_out = False
  for p in procs:
    try:
      p.wait(timeout=max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      timed_out = True
  for p in procs:  # never leave a process behind, whatever happened
    if p.poll() is None:
      p.kill()
      p.wait()
  text = []
  for pid, log in enumerate(logs):
    log.seek(0)
    tail = "".join(l for l in log.readlines() if not l.startswith(("W0", "I0")))[-4000:]
    text.append(f"--- process {pid} (rc={procs[pid].returncode}) ---\n{tail}")
    log.close()
  found = [json.loads(r.read_text()) if r.exists() else {} for r in results]
  return found, timed_out, [p.returncode for p in procs], "\n".join(text)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
  return _run_job(tmp_path_factory.mktemp("mp"))


@pytest.mark.multiprocess
def test_job_finishes_cleanly(job):
  found, timed_out, codes, logs = job
  assert not timed_out, f"the 2-process job did not finish in {TIMEOUT} s\n{logs}"
  assert codes == [0] * NPROC, f"worker exit codes {codes}\n{logs}"


@pytest.mark.multiprocess
@pytest.mark.parametrize("program", EXPECTED)
def test_program_matches_legacy_on_every_process(job, program):
  found, _, _, logs = job
  for pid, results in enumerate(found):
    assert program in results, f"process {pid} never reported {program}\n{logs}"
    assert results[program] == "ok", f"process {pid}, {program}: {results[program]}"
