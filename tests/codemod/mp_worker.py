"""One process of the 2-process job test_codemod_multiprocess.py launches.

usage: mp_worker.py PROCESS_ID PORT PROGRAMS_DIR RESULT_JSON

Joins a jax.distributed job over 127.0.0.1 (gloo CPU collectives, 4 CPU devices per
process), imports every module in PROGRAMS_DIR (the directory is on sys.path, so the
converted ones find the support module the codemod wrote there) in sorted order, and
calls its ``run()``. Both processes run the same programs in the same order, so their
collectives line up. Writes {module: {"value": nested list, "dtype": str} | {"error":
text}} to RESULT_JSON, this process's own file.
"""
from __future__ import annotations

import importlib
import json
import os
import sys

PID, PORT, PROGRAMS, RESULT = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, PROGRAMS)

import jax  # noqa: E402
import numpy as np  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{PORT}", num_processes=2,
                           process_id=PID, initialization_timeout=60)

results = {}
for name in sorted(f[:-3] for f in os.listdir(PROGRAMS)
                   if f.endswith(".py") and f != "pmap_shard_map.py"):
  try:
    value = np.asarray(importlib.import_module(name).run())
    results[name] = {"value": value.tolist(), "dtype": str(value.dtype)}
  except Exception as e:  # the test reads the message: it must name the fix
    results[name] = {"error": f"{type(e).__name__}: {e}"}
with open(RESULT, "w", encoding="utf-8") as f:
  json.dump(results, f)
