"""One process of the 2-process ``.lower()`` job (launched by test_pmap_lower_multiprocess.py
through support.multiprocess_jobs, which describes the job in the environment).

Runs each program under legacy ``jax.pmap`` and under ``pmap_compat.pmap`` with this
process's host-local slice and writes {program: "ok" | error} as its results. On jax 0.10,
whose own jax.pmap cannot call a compiled program with host-local arguments, the
reference is the same computation called directly under 0.10.2's jax.pmap.
"""
import functools
import os
import sys
import traceback

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
from support import multiprocess_jobs  # noqa: E402

ME = multiprocess_jobs.join()
PID, LOCAL = ME.process_id, ME.local_devices

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import pmap_compat  # noqa: E402
from support.compare import assert_trees_equal, run_program  # noqa: E402
from support.jax_lines import on_legacy_line  # noqa: E402


def local(*shape):
  return (np.arange(int(np.prod(shape))).reshape(shape) % 7 + 10 * (PID + 1)).astype(np.float32)


# Each program runs its pmap ahead of time (``aot``) or, as a reference, calls it directly.


def lower_compile_call(pm, aot=True):
  f = pm(lambda x: (lax.psum(x, "i"), x * 2, lax.axis_index("i")), "i")
  if not aot:
    return f(local(LOCAL, 3) + 1)
  lowered = f.lower(local(LOCAL, 3))
  assert "func" in lowered.as_text()
  if pm is pmap_compat.pmap:  # the global program, lowered once for the whole job
    assert type(lowered).__name__ == "LocalLowered", type(lowered)
    assert "num_partitions = 8" in lowered.as_text()
  return lowered.compile()(local(LOCAL, 3) + 1)


def lower_static_and_kwargs(pm, aot=True):
  f = pm(lambda x, n, *, y: {"a": lax.pmax(x * n, "i"), "b": y - x}, "i",
         static_broadcasted_argnums=1)
  if not aot:
    return f(local(LOCAL, 2), 3, y=local(LOCAL, 2) * 5)
  compiled = f.lower(local(LOCAL, 2), 3, y=local(LOCAL, 2)).compile()
  return compiled(local(LOCAL, 2), y=local(LOCAL, 2) * 5)


def trace_then_lower(pm, aot=True):
  f = pm(lambda x: lax.pmean(x, "i") + x, "i", in_axes=1, out_axes=1)
  if not aot:
    return f(local(2, LOCAL))
  return f.trace(local(2, LOCAL)).lower().compile()(local(2, LOCAL))


PROGRAMS = [lower_compile_call, lower_static_and_kwargs, trace_then_lower]


def main():
  results = {}
  for prog in PROGRAMS:
    try:
      legacy = run_program(prog if on_legacy_line() else functools.partial(prog, aot=False),
                           jax.pmap)
      ours = run_program(prog, pmap_compat.pmap)
      if legacy.error is not None:
        raise AssertionError(f"legacy failed: {legacy.error!r}")
      if ours.error is not None:
        raise ours.error
      assert_trees_equal(legacy.value, ours.value)
      results[prog.__name__] = "ok"
    except Exception:  # pylint: disable=broad-except
      results[prog.__name__] = traceback.format_exc()[-2000:]
  multiprocess_jobs.write_results(ME, results)
  multiprocess_jobs.leave()


if __name__ == "__main__":
  main()
