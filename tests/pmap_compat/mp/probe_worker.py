"""One process of the small jobs test_multiprocess.py runs to check the job harness itself.

usage: probe_worker.py OFFSET

Computes a psum over every device of the job from this process's int32 slice, shifted by
OFFSET so that concurrent jobs differ, under ``jax.pmap`` (legacy on jax 0.6) and under
``pmap_compat.pmap``, and reports the slice and both results.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
from support import multiprocess_jobs  # noqa: E402

ME = multiprocess_jobs.join()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import pmap_compat  # noqa: E402


def main() -> None:
  offset = int(sys.argv[1])
  mine = (np.arange(ME.local_devices * 3).reshape(ME.local_devices, 3)
          + 1000 * ME.process_id + offset).astype(np.int32)
  results: dict = {"slice": mine.tolist()}
  for name, pmap in [("reference", jax.pmap), ("ours", pmap_compat.pmap)]:
    pmapped = multiprocess_jobs.one_program_in_flight(pmap)(lambda x: lax.psum(x, "i"), "i")
    results[name] = np.asarray(pmapped(mine)).tolist()
  multiprocess_jobs.write_results(ME, results)
  multiprocess_jobs.leave()


if __name__ == "__main__":
  main()
