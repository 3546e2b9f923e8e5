"""bench/pmap_dispatch.py's measuring machinery: what it times with and how it pairs rounds,
so it gives a verdict on any backend (no target is checked here: those live in the bench)."""
import importlib.util
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench():
  spec = importlib.util.spec_from_file_location(
      "pmap_dispatch_bench", os.path.join(ROOT, "bench", "pmap_dispatch.py"))
  assert spec is not None and spec.loader is not None
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # its dataclasses look their module up there
  spec.loader.exec_module(module)
  return module


def test_rounds_a_coarse_clock_read_as_zero_are_left_out_of_the_ratios():
  bench = _bench()
  results = {("ours", "psum"): {0: 0.0, 1: 2e-6, 2: 3e-6},
             ("jax.pmap", "psum"): {0: 1e-6, 1: 0.0, 2: 6e-6}}
  assert bench.paired_ratios(results, "ours", "jax.pmap", "psum") == [0.5]
  assert bench.paired_ratio(results, "ours", "jax.pmap", "missing case") is None


def test_a_clock_that_ticks_per_scheduler_tick_is_not_used_for_single_calls():
  bench = _bench()
  tick = 0.004  # a 250 Hz CPU-time clock

  def coarse() -> float:
    return (time.perf_counter() // tick) * tick

  assert not bench._ticks_finely(coarse)
  assert bench._ticks_finely(time.perf_counter)


def test_cases_map_over_the_backends_devices():
  import jax
  bench = _bench()
  assert bench.n_devices() == jax.local_device_count()
  steps = bench._pmap_cases(jax.pmap)
  run = steps[bench.DISPATCH_STEP]()
  first, second = run(), run()
  assert first[0].shape[0] == jax.local_device_count()
  assert not (first[0] == second[0]).all()  # the state moves: each call is a real step
