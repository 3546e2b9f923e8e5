"""One process of the 2-process job test_codemod_multiprocess.py launches through
support.multiprocess_jobs (which describes the job in the environment).

usage: mp_worker.py PROGRAMS_DIR

Joins a jax.distributed job over 127.0.0.1 (gloo CPU collectives, 4 CPU devices per
process), imports every module in PROGRAMS_DIR (the directory is on sys.path, so the
converted ones find the support module the codemod wrote there) in sorted order, and
calls its ``run()``, which waits for its results (np.asarray) before the next one starts.
Both processes run the same programs in the same order, so their collectives line up.
Its results are {module: {"value": nested list, "dtype": str} | {"error": text}}.
"""
from __future__ import annotations

import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support import multiprocess_jobs  # noqa: E402

ME = multiprocess_jobs.join()
PROGRAMS = sys.argv[1]
sys.path.insert(0, PROGRAMS)

import numpy as np  # noqa: E402

results = {}
for name in sorted(f[:-3] for f in os.listdir(PROGRAMS)
                   if f.endswith(".py") and f != "pmap_shard_map.py"):
  try:
    value = np.asarray(importlib.import_module(name).run())
    results[name] = {"value": value.tolist(), "dtype": str(value.dtype)}
  except Exception as e:  # the test reads the message: it must name the fix
    results[name] = {"error": f"{type(e).__name__}: {e}"}
multiprocess_jobs.write_results(ME, results)
multiprocess_jobs.leave()
