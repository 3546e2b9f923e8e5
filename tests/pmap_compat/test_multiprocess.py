"""Row 23: a 2-process x 4-CPU-device job over 127.0.0.1 (jax.distributed + gloo).

Each process passes its host-local slice exactly as with legacy pmap; collectives
span both processes; out_axes=None, in_axes=None, typed keys, donation, static args,
chaining our own outputs, mixing with legacy pmap and pmap under jit are compared
against legacy ``jax.pmap`` run the same way (see mp/worker.py). Bounded: the job
is killed after TIMEOUT seconds and the test fails with both processes' logs.

The harness (support.multiprocess_jobs) is tested here too: a process of another job is
refused, and a second job running beside the main one computes over its own processes
only (the main job's comparisons show the same for it).
"""
import concurrent.futures
import os

import numpy as np
import pytest

from support.multiprocess_jobs import FOREIGN_JOB, run_job

MP = os.path.join(os.path.dirname(__file__), "mp")
WORKER = os.path.join(MP, "worker.py")
PROBE = os.path.join(MP, "probe_worker.py")
NPROC = 2
TIMEOUT = 150
EXPECTED = ["p_psum_and_index", "p_collectives", "p_broadcast_in_and_out",
            "p_pytree_and_kwargs", "p_chained_outputs", "p_back_to_back_calls",
            "p_static_argument", "p_donation", "p_typed_keys", "p_legacy_outputs_in",
            "p_outputs_into_legacy", "p_under_jit", "global_under_jit"]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
  """The main job and, at the same time, a small job beside it whose slices differ."""
  dirs = [str(tmp_path_factory.mktemp(name)) for name in ("mp", "beside")]
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    main = pool.submit(run_job, WORKER, dirs[0], num_processes=NPROC, timeout=TIMEOUT)
    beside = pool.submit(run_job, PROBE, dirs[1], num_processes=NPROC, args=["500"],
                         timeout=TIMEOUT)
    return main.result(), beside.result()


@pytest.fixture(scope="module")
def job(jobs):
  return jobs[0]


@pytest.mark.multiprocess
def test_job_finishes_cleanly(job):
  assert not job.timed_out, f"the 2-process job did not finish in {TIMEOUT} s\n{job.logs}"
  assert job.returncodes == [0] * NPROC, f"worker exit codes {job.returncodes}\n{job.logs}"


@pytest.mark.multiprocess
@pytest.mark.parametrize("program", EXPECTED)
def test_program_matches_legacy_on_every_process(job, program):
  for pid, results in enumerate(job.results):
    assert results is not None, f"process {pid} wrote no results\n{job.logs}"
    assert program in results, f"process {pid} never reported {program}\n{job.logs}"
    assert results[program] == "ok", f"process {pid}, {program}: {results[program]}"


@pytest.mark.multiprocess
def test_a_process_of_another_job_is_refused(tmp_path):
  # Process 1 carries another job's token, as if it had reached this job's coordinator.
  outcome = run_job(PROBE, str(tmp_path), num_processes=NPROC, args=["0"],
                    tokens=["job-a", "job-b"], timeout=TIMEOUT, init_timeout=30)
  assert not outcome.timed_out, outcome.logs
  assert all(code != 0 for code in outcome.returncodes), outcome.logs
  assert outcome.results == [None] * NPROC, outcome.logs
  assert outcome.logs.count(FOREIGN_JOB) == NPROC, outcome.logs


@pytest.mark.multiprocess
def test_a_job_beside_another_reduces_over_its_own_processes(jobs):
  beside = jobs[1]
  assert beside.clean, f"exit codes {beside.returncodes}\n{beside.logs}"
  slices = [np.asarray(r["slice"]) for r in beside.results]
  own_total = sum(s.sum(0) for s in slices)  # what a psum over this job alone gives
  for pid, r in enumerate(beside.results):
    assert r["ours"] == r["reference"], (pid, r)
    np.testing.assert_array_equal(np.asarray(r["reference"]),
                                  np.broadcast_to(own_total, slices[pid].shape))
