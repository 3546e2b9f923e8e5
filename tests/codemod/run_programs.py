"""Runs programs in whatever JAX environment executes this script (tests start it in
each project environment through tests/support/venvs.py).

usage: run_programs.py PROGRAMS_DIR RESULT_PICKLE [MODULE...]

Imports each module of PROGRAMS_DIR (or the ones named), calls its ``run()``, and
pickles {module: ("ok", [(path, dtype, shape, bytes), ...]) | ("error", text)}: leaves
by key path, as plain data, so results from different JAX versions compare without
unpickling either's types. Typed PRNG keys are stored as their key data.
"""
from __future__ import annotations

import importlib
import os
import pickle
import sys

PROGRAMS, RESULT = sys.argv[1], sys.argv[2]
sys.path.insert(0, PROGRAMS)

import jax  # noqa: E402
import numpy as np  # noqa: E402


def _plain(value):
  leaves = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
    if hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      leaf = jax.random.key_data(leaf)
    array = np.asarray(leaf)
    leaves.append((jax.tree_util.keystr(path), str(array.dtype), array.shape,
                   np.ascontiguousarray(array).tobytes()))
  return leaves


names = sys.argv[3:] or sorted(f[:-3] for f in os.listdir(PROGRAMS)
                               if f.endswith(".py") and f != "pmap_shard_map.py")
results = {}
for name in names:
  try:
    results[name] = ("ok", _plain(jax.block_until_ready(importlib.import_module(name).run())))
  except Exception as e:  # recorded: the test decides whether an error is expected
    results[name] = ("error", f"{type(e).__name__}: {e}")
with open(RESULT, "wb") as f:
  pickle.dump(results, f)
