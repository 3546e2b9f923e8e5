"""The data-parallel SGD step as a multi-process (multi-host) job.

Each process owns its local devices and feeds only its own slice of the global
batch, exactly as one host of a pod slice does; pmean/psum inside the step span
the devices of every process. Run it as

  python examples/multiprocess_sgd.py                # one process, all local devices
  python examples/multiprocess_sgd.py --processes 2  # 2 local processes x 4 CPU devices

The second form starts the processes itself over 127.0.0.1 with gloo CPU
collectives; on real hosts you would start one process per host with the
PMAP_EXAMPLE_* variables below (or call jax.distributed.initialize() with the
cluster's own settings).
"""
from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

COORDINATOR = "PMAP_EXAMPLE_COORDINATOR"  # host:port of process 0
NUM_PROCESSES = "PMAP_EXAMPLE_NUM_PROCESSES"
PROCESS_ID = "PMAP_EXAMPLE_PROCESS_ID"
REPORT = "PMAP_EXAMPLE_REPORT"  # where a launched process writes its report


def maybe_initialize() -> bool:
  """Joins the distributed job described by the environment, if there is one."""
  address = os.environ.get(COORDINATOR)
  if not address:
    return False
  if not jax.distributed.is_initialized():
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(address, num_processes=int(os.environ[NUM_PROCESSES]),
                               process_id=int(os.environ[PROCESS_ID]))
  return True


def loss_fn(params, x, y):
  return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


@functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0,))
def train_step(params, x, y, process_weight):
  loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
  grads = jax.lax.pmean(grads, "batch")  # spans every process's devices
  params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
  loss = jax.lax.pmean(loss, "batch")
  # A value that differs per process, reduced globally: proves the psum is not host-local.
  weighted = jax.lax.psum(process_weight, "batch")
  return params, loss, weighted


def local_batch(process: int, n_local: int, per_device: int = 8, features: int = 4):
  true_w = np.linspace(-1.0, 1.0, features, dtype=np.float32)
  rng = np.random.default_rng(100 + process)  # every process reads different data
  x = rng.normal(size=(n_local, per_device, features)).astype(np.float32)
  return x, (x @ true_w - 0.25).astype(np.float32)


def run(steps: int = 4) -> dict:
  maybe_initialize()
  n_local = jax.local_device_count()
  process = jax.process_index()
  x, y = local_batch(process, n_local)
  params = {"w": np.zeros((n_local, x.shape[-1]), np.float32),
            "b": np.zeros((n_local,), np.float32)}
  weight = np.full((n_local,), process + 1, np.float32)
  losses = []
  for _ in range(steps):
    params, loss, weighted = train_step(params, x, y, weight)
    losses.append(loss)
  return {"params": params, "losses": jnp.stack(losses), "weighted": weighted,
          "process_index": process, "process_count": jax.process_count(),
          "global_devices": jax.device_count()}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch(processes: int, devices_per_process: int, timeout: float = 120.0) -> int:
  """Starts this script `processes` times on this machine as one distributed job, then
  prints each process's report in process order (each process writes its own file, so
  reports never interleave on a shared stdout)."""
  with tempfile.TemporaryDirectory(prefix="multiprocess_sgd-") as reports:
    env = dict(os.environ, JAX_PLATFORMS="cpu", **{
        COORDINATOR: f"127.0.0.1:{_free_port()}", NUM_PROCESSES: str(processes),
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices_per_process}"})
    paths = [os.path.join(reports, f"process_{i}.txt") for i in range(processes)]
    procs = [subprocess.Popen([sys.executable, __file__],
                              env=dict(env, **{PROCESS_ID: str(i), REPORT: path}))
             for i, path in enumerate(paths)]
    try:
      status = max(p.wait(timeout=timeout) for p in procs)
    finally:
      for p in procs:
        if p.poll() is None:
          p.kill()
    for path in paths:
      if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
          sys.stdout.write(f.read())
    return status


def report(out: dict) -> str:
  p = out["process_index"]
  return (f"process {p}/{out['process_count']}, {jax.local_device_count()} local of "
          f"{out['global_devices']} devices\n"
          f"  [p{p}] loss per step: {np.asarray(out['losses'])[:, 0]}\n"
          f"  [p{p}] psum of per-process weights: {float(out['weighted'][0])}\n")


def main() -> int:
  if "--processes" in sys.argv:
    count = int(sys.argv[sys.argv.index("--processes") + 1])
    return launch(count, devices_per_process=max(1, 8 // count))
  out = run()
  text = report(out)
  path = os.environ.get(REPORT)
  if path:  # started by launch(): a file of its own, complete or absent
    with open(path + ".tmp", "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(path + ".tmp", path)
  else:
    sys.stdout.write(text)
  if jax.distributed.is_initialized():
    del out  # release the arrays first: processes can hang at exit holding them
    jax.distributed.shutdown()
  return 0


if __name__ == "__main__":
  sys.exit(main())
