"""Row 24 in a 2-process x 4-device job: ``.lower()``/``.trace()`` take host-local arguments
and ``.compile()(x)`` returns host-local results, exactly like legacy pmap (bounded, killed
after TIMEOUT seconds)."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

WORKER = os.path.join(os.path.dirname(__file__), "lower_mp_worker.py")
NPROC = 2
TIMEOUT = 120
PROGRAMS = ["lower_compile_call", "lower_static_and_kwargs", "trace_then_lower"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("lower_mp")
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  procs = [subprocess.Popen([sys.executable, WORKER, str(pid), str(NPROC), str(port),
                             str(tmp / f"r{pid}.json")],
                            stdout=open(tmp / f"log{pid}", "w"), stderr=subprocess.STDOUT, env=env)
           for pid in range(NPROC)]
  deadline = time.monotonic() + TIMEOUT
  for p in procs:
    try:
      p.wait(timeout=max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      pass
  for p in procs:
    if p.poll() is None:
      p.kill()
      p.wait()
  logs = "\n".join((tmp / f"log{pid}").read_text()[-3000:] for pid in range(NPROC))
  found = [json.loads((tmp / f"r{pid}.json").read_text()) if (tmp / f"r{pid}.json").exists()
           else {} for pid in range(NPROC)]
  return found, [p.returncode for p in procs], logs


@pytest.mark.multiprocess
@pytest.mark.parametrize("program", PROGRAMS)
def test_lower_on_every_process_matches_legacy(results, program):
  found, codes, logs = results
  assert codes == [0] * NPROC, f"worker exit codes {codes}\n{logs}"
  for pid, res in enumerate(found):
    assert res.get(program) == "ok", f"process {pid}, {program}: {res.get(program)}\n{logs}"
