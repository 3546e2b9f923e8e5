"""Row 24 in a 2-process x 4-device job: ``.lower()``/``.trace()`` take host-local arguments
and ``.compile()(x)`` returns host-local results, exactly like legacy pmap (bounded, killed
after TIMEOUT seconds)."""
import os

import pytest

from support.multiprocess_jobs import run_job

WORKER = os.path.join(os.path.dirname(__file__), "lower_mp_worker.py")
NPROC = 2
TIMEOUT = 120
PROGRAMS = ["lower_compile_call", "lower_static_and_kwargs", "trace_then_lower"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
  return run_job(WORKER, str(tmp_path_factory.mktemp("lower_mp")), num_processes=NPROC,
                 timeout=TIMEOUT)


@pytest.mark.multiprocess
@pytest.mark.parametrize("program", PROGRAMS)
def test_lower_on_every_process_matches_legacy(job, program):
  assert job.clean, f"worker exit codes {job.returncodes}, timed out: {job.timed_out}\n{job.logs}"
  for pid, res in enumerate(job.results):
    assert res is not None and res.get(program) == "ok", (
        f"process {pid}, {program}: {res and res.get(program)}\n{job.logs}")
