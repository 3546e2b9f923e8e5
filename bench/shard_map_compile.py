"""Benchmark: shard_map_impl.shard_map vs JAX's own shard_map.

Reports, for a 200-op body on an 8-device CPU mesh, the time to trace, lower
and compile a ``jax.jit`` of the shard_map (median over fresh functions, JAX's
caches cleared in between), and the steady-state call time of the compiled
function.  Targets: trace+lower+compile <= 1.1x JAX's, call time 1.0x.
JAX's shard_map is `jax.experimental.shard_map.shard_map` on jax 0.6.0 and the
public `jax.shard_map` on jax 0.10.2 (`jax_shard_map` below is the only place
that knows); both are called with the keywords they share.

Run: python bench/shard_map_compile.py [--reps N] [--calls N]   (either venv)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

import shard_map_impl  # noqa: E402



def jax_shard_map() -> tuple[str, object]:
  """This JAX line's own shard_map: (name, callable)."""
  if jax.__version__ == "0.6.0":
    from jax.experimental.shard_map import shard_map  # pylint: disable=import-outside-toplevel
    return "jax.experimental.shard_map", shard_map
  return "jax.shard_map", jax.shard_map


ROUNDS = 11  # 18 equations per round: ~200 primitive applications in the body


def body(x, w):
  """Elementwise chain, matmuls and collectives, ROUNDS times."""
  y = x
  for _ in range(ROUNDS):
    y = jnp.sin(y) * 1.01 + w[0]
    y = y @ w
    y = jax.lax.psum(y, "y") * 0.5
    y = jnp.tanh(y - jax.lax.axis_index("x"))
  return y


def make(sm, mesh):
  return sm(body, mesh=mesh, in_specs=(P("x", "y"), P()), out_specs=P("x"))


def compile_once(sm, mesh, args) -> dict:
  """Trace, lower and compile a fresh jit of the shard_map, caches cleared."""
  jax.clear_caches()
  f = jax.jit(make(sm, mesh))
  t0 = time.perf_counter()
  traced = f.trace(*args)
  t1 = time.perf_counter()
  lowered = traced.lower()
  t2 = time.perf_counter()
  lowered.compile()
  t3 = time.perf_counter()
  return {"trace": t1 - t0, "lower": t2 - t1, "compile": t3 - t2, "total": t3 - t0}


def time_compiles(impls: dict, mesh, args, reps: int) -> dict:
  """Median phase times per implementation; runs interleaved to share noise."""
  samples = {name: [] for name in impls}
  for _ in range(reps):
    for name, sm in impls.items():
      samples[name].append(compile_once(sm, mesh, args))
  return {name: {k: statistics.median(s[k] for s in runs) for k in runs[0]}
          for name, runs in samples.items()}


def time_calls(impls: dict, mesh, args, calls: int) -> dict:
  """Median steady-state call time per implementation, calls interleaved."""
  fns = {name: jax.jit(make(sm, mesh)) for name, sm in impls.items()}
  for f in fns.values():
    jax.block_until_ready(f(*args))
  samples = {name: [] for name in fns}
  for _ in range(calls):
    for name, f in fns.items():
      t0 = time.perf_counter()
      jax.block_until_ready(f(*args))
      samples[name].append(time.perf_counter() - t0)
  return {name: statistics.median(v) for name, v in samples.items()}


def count_ops(sm, mesh, args) -> int:
  jaxpr = jax.make_jaxpr(make(sm, mesh))(*args).jaxpr
  body_jaxpr = jaxpr.eqns[0].params["jaxpr"]  # a Jaxpr or ClosedJaxpr, by JAX line
  return len(getattr(body_jaxpr, "jaxpr", body_jaxpr).eqns)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--calls", type=int, default=200)
  opts = parser.parse_args()
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
  args = (np.ones((16, 8), np.float32), np.full((4, 4), 0.01, np.float32))
  ref_name, ref = jax_shard_map()
  impls = {ref_name: ref, "shard_map_impl": shard_map_impl.shard_map}
  assert np.array_equal(jax.jit(make(ref, mesh))(*args),
                        jax.jit(make(shard_map_impl.shard_map, mesh))(*args))
  time_compiles(impls, mesh, args, 1)  # warm up imports / first-use costs
  rows = time_compiles(impls, mesh, args, opts.reps)
  for name, t in time_calls(impls, mesh, args, opts.calls).items():
    rows[name]["call"] = t
  n = count_ops(shard_map_impl.shard_map, mesh, args)
  ref, ours = rows[ref_name], rows["shard_map_impl"]
  print(f"jax {jax.__version__}; body: {n} jaxpr equations; mesh 4x2 CPU; median of {opts.reps} fresh "
        f"compiles, {opts.calls} calls")
  print(f"{'':28} {'trace':>9} {'lower':>9} {'compile':>9} {'total':>9} {'call':>9}")
  for name, r in rows.items():
    print(f"{name:28} " + " ".join(f"{r[k] * 1e3:8.2f}ms" for k in
                                   ("trace", "lower", "compile", "total", "call")))
  print(f"{'ratio (ours / jax)':28} " + " ".join(
      f"{ours[k] / ref[k]:9.3f}" for k in ("trace", "lower", "compile", "total", "call")))


if __name__ == "__main__":
  main()
