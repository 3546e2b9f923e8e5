"""Multi-process JAX jobs for tests: worker processes joined over 127.0.0.1 by
jax.distributed (gloo CPU collectives), launched, bounded in time and read back safely.

The test calls ``run_job(worker, ...)``; the worker calls ``join()`` before anything else
imports jax, ``write_results(...)`` with its findings, then ``leave()``.

What this guards against, each seen or shown on this machine:

* Two jobs on one coordinator port. gRPC binds the coordinator with SO_REUSEPORT, so a
  second coordinator on a port in use starts without an error and the kernel spreads
  both jobs' processes over the two. Picking a free port and closing it left seconds for
  another job to take it before the coordinator binds. ``reserved_port`` instead keeps
  the port bound (SO_REUSEPORT, not listening) until the job is over: the coordinator can
  still bind it, while the kernel hands it to no one else. And every process checks, in
  the coordinator's key-value store, that all members carry its job's token: a process
  in a foreign job stops with an error instead of computing with a stranger's data.
* Half-written, stale or foreign result files: each process writes its own file in the
  job's fresh directory, atomically, stamped with the token and its process id; the
  launcher accepts no other.
* Hangs: a job is killed at its deadline, and the outcome says so, with the logs.
* Overlapping collectives. With jax 0.6.0's CPU gloo collectives, two independent programs
  with cross-process collectives in flight at once can take each other's messages: wrong
  values or a deadlock, with legacy jax.pmap, pmap_compat and plain jit(shard_map) alike
  (calls chained through their results are safe; not seen on jax 0.10.2).
  ``one_program_in_flight`` makes a pmap wait for each call's results; workers use it for
  every program they compare.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

_ENV = "PMAP_COMPAT_JOB_"  # prefix of the variables that describe a job to its workers
_TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ROOT = os.path.dirname(_TESTS)
TOKEN_KEY = "pmap_compat_test_job/token/{}"
FOREIGN_JOB = "joined a foreign job"  # the words a refusing worker's error starts with


# ----------------------------------------------------------------------------- launcher


@contextlib.contextmanager
def reserved_port() -> Iterator[int]:
  """A free 127.0.0.1 port, held (bound, not listening) until the block ends, so that
  only a SO_REUSEPORT listener such as the job's coordinator can bind it meanwhile."""
  with socket.socket() as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]


@dataclasses.dataclass
class JobOutcome:
  """What a job left: per process its results (None if it wrote none), exit code and log."""
  results: list[dict[str, Any] | None]
  returncodes: list[int | None]
  timed_out: bool
  logs: str

  @property
  def clean(self) -> bool:
    return not self.timed_out and self.returncodes == [0] * len(self.returncodes)


def _log_tail(path: str, limit: int) -> str:
  with open(path, encoding="utf-8", errors="replace") as f:
    lines = [l for l in f if not l.startswith(("W0", "I0"))]  # absl chatter
  return "".join(lines)[-limit:]


def _read_result(path: str, token: str, process_id: int) -> dict[str, Any] | None:
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    stamped = json.load(f)
  if stamped.get("token") != token or stamped.get("process_id") != process_id:
    raise AssertionError(f"{path} was written by another job or process: {stamped!r:.300}")
  return stamped["results"]


def run_job(worker: str, job_dir: str, *, num_processes: int = 2, local_devices: int = 4,
            args: Sequence[str] = (), timeout: float = 150,
            tokens: Sequence[str] | None = None, init_timeout: int = 60) -> JobOutcome:
  """Runs ``python worker *args`` as each process of one job and waits at most ``timeout``
  seconds (then kills what is left). ``job_dir`` must be fresh: it receives each process's
  log and result file. ``tokens`` overrides the job's single random token per process
  (to test that a process of another job is refused)."""
  if os.listdir(job_dir):
    raise ValueError(f"job_dir must be an empty directory, got {job_dir} with "
                     f"{sorted(os.listdir(job_dir))[:5]}")
  token = secrets.token_hex(8)
  tokens = list(tokens) if tokens is not None else [token] * num_processes
  if len(tokens) != num_processes:
    raise ValueError(f"tokens must have one entry per process ({num_processes}), got {tokens}")
  base = {k: v for k, v in os.environ.items()
          if k not in ("XLA_FLAGS", "JAX_PLATFORMS") and not k.startswith(_ENV)}
  logs = [os.path.join(job_dir, f"process{pid}.log") for pid in range(num_processes)]
  results = [os.path.join(job_dir, f"process{pid}.json") for pid in range(num_processes)]
  procs: list[subprocess.Popen] = []
  timed_out = False
  with reserved_port() as port:
    try:
      for pid in range(num_processes):
        env = dict(base, **{
            f"{_ENV}COORDINATOR": f"127.0.0.1:{port}", f"{_ENV}NUM_PROCESSES": str(num_processes),
            f"{_ENV}PROCESS_ID": str(pid), f"{_ENV}LOCAL_DEVICES": str(local_devices),
            f"{_ENV}TOKEN": tokens[pid], f"{_ENV}RESULT": results[pid],
            f"{_ENV}INIT_TIMEOUT": str(init_timeout)})
        with open(logs[pid], "w") as log:
          procs.append(subprocess.Popen([sys.executable, worker, *args], stdout=log,
                                        stderr=subprocess.STDOUT, env=env, cwd=_ROOT))
      deadline = time.monotonic() + timeout
      for p in procs:
        try:
          p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
          timed_out = True
    finally:
      for p in procs:  # never leave a process behind, whatever happened
        if p.poll() is None:
          p.kill()
          p.wait()
  text = "\n".join(f"--- process {pid} (rc={p.returncode}) ---\n{_log_tail(logs[pid], 4000)}"
                   for pid, p in enumerate(procs))
  found = [_read_result(r, tokens[pid], pid) for pid, r in enumerate(results)]
  return JobOutcome(found, [p.returncode for p in procs], timed_out, text)


# ------------------------------------------------------------------------------- worker


@dataclasses.dataclass(frozen=True)
class Member:
  """This worker's place in its job."""
  process_id: int
  num_processes: int
  local_devices: int
  token: str
  result_path: str


def join() -> Member:
  """Joins the job that ``run_job`` started this process for; call it before anything
  imports jax. Exits with an error naming the mismatch if a process of another job
  shares the coordinator."""
  env = os.environ
  me = Member(int(env[f"{_ENV}PROCESS_ID"]), int(env[f"{_ENV}NUM_PROCESSES"]),
              int(env[f"{_ENV}LOCAL_DEVICES"]), env[f"{_ENV}TOKEN"], env[f"{_ENV}RESULT"])
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={me.local_devices}"
  env["JAX_PLATFORMS"] = "cpu"
  # The repository root first (tests/pmap_compat must not shadow the package), then tests/.
  sys.path[:0] = [_ROOT, _TESTS]
  import jax  # pylint: disable=import-outside-toplevel
  from jax._src import distributed  # pylint: disable=import-outside-toplevel

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  timeout = int(env[f"{_ENV}INIT_TIMEOUT"])
  jax.distributed.initialize(coordinator_address=env[f"{_ENV}COORDINATOR"],
                             num_processes=me.num_processes, process_id=me.process_id,
                             initialization_timeout=timeout)
  # The key-value store has no public API; it is the coordinator's own, so only members
  # of the job that owns the coordinator see each other's tokens.
  client = distributed.global_state.client
  assert client is not None  # initialize() above made it
  client.key_value_set(TOKEN_KEY.format(me.process_id), me.token)
  for other in range(me.num_processes):
    theirs = client.blocking_key_value_get(TOKEN_KEY.format(other), timeout * 1000)
    if theirs != me.token:
      raise SystemExit(f"{FOREIGN_JOB}: process {me.process_id} carries token {me.token} but "
                       f"process {other} of the job it joined carries {theirs}; another job "
                       "shares the coordinator port")
  return me


def write_results(me: Member, results: dict[str, Any]) -> None:
  """Writes (replaces, atomically) this process's results, stamped for the launcher."""
  tmp = f"{me.result_path}.{os.getpid()}.tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump({"token": me.token, "process_id": me.process_id, "results": results}, f)
  os.replace(tmp, me.result_path)


def leave() -> None:
  import jax  # pylint: disable=import-outside-toplevel
  jax.distributed.shutdown()


def one_program_in_flight(pmap: Callable[..., Any]) -> Callable[..., Any]:
  """``pmap`` whose calls return only once their results are ready (not under a trace), so
  a worker never has two independent collective programs in flight (see the module
  docstring). What a call returns is unchanged."""
  import jax  # pylint: disable=import-outside-toplevel

  def settled(fun: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
      out = fun(*args, **kwargs)
      if not any(isinstance(l, jax.core.Tracer) for l in jax.tree.leaves(out)):
        jax.block_until_ready(out)
      return out
    return call

  def wrapped(*args: Any, **kwargs: Any) -> Callable[..., Any]:
    return settled(pmap(*args, **kwargs))
  return wrapped
