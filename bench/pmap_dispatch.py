"""Per-call dispatch cost of pmap implementations, interleaved in one run.

Runs on either supported JAX line; what it compares against depends on the line (the
`LINES` table below is the only place that knows):

  jax 0.6.0 (legacy pmap still present), columns:
    legacy   - jax.pmap of jax 0.6.0 (the reference, ratio 1.0)
    ours     - pmap_compat.pmap
    jit      - hand-written jax.jit(shard_map_impl.shard_map(...)) (what a full migration costs)
    merge    - jax.pmap with JAX_PMAP_SHMAP_MERGE=true, in a worker process (the flag is
               read at import), driven round by round from this one
  jax 0.10.2 (legacy pmap removed), columns:
    jax.pmap - 0.10.2's own jax.pmap, a jit + shard_map re-implementation (the reference)
    ours     - pmap_compat.pmap
    jit      - hand-written jax.jit(jax.shard_map(...)) doing the same thing
    and the issue's targets, each with PASS/FAIL: per call ours <= jax.pmap and
    <= 1.15x jit; first call <= 1.3x jax.pmap; out[0] <= jax.pmap.

Cases (rows): steady-state cases report the median main-thread CPU time of one call
(time.thread_time; wall time where this machine's thread clock ticks too coarsely to
time one call, as on some accelerator hosts), with the devices idle at the start of each
call (we wait for each result outside the timed region); `first call` reports process CPU time (compilation
runs on other threads) of tracing, compiling and calling a brand-new function; `matmul`
reports wall time per call with block_until_ready and is compared as throughput (its
time is the same XLA executable's in every column, so its target is a noise margin);
the two `train step` cases report wall time per step, waiting for its result, of an MLP
trained with value_and_grad, pmean and an SGD update: small enough that dispatch bounds
it, and large enough that the devices' compute does.
Each round runs every case on every implementation. The implementations timed in this
process alternate call by call, in a freshly shuffled order for every call, so load that
comes and goes on a busy machine hits each of them alike (the merge worker's block of
calls takes a shuffled place among them). The figure is the median over rounds of the
per-round medians; a ratio is the median over rounds of that round's a/b ratio (pairing
by round cancels load drifting between rounds), lower is better except for matmul
throughput (b/a, higher is better).

  python bench/pmap_dispatch.py            # full run (a few minutes), either venv
  python bench/pmap_dispatch.py --quick    # smoke test (< 30 s): tiny call, pytree and
                                           # out[0], no merge worker
  python bench/pmap_dispatch.py --strict   # exit status 1 when a target fails
  JAX_PLATFORMS=tpu python bench/pmap_dispatch.py   # on an accelerator's own devices
It maps over every local device of the backend JAX runs on (8 forced host devices on
the CPU, the default platform). The last line is a one-line summary starting with "dispatch:".
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time

CPU_DEVICES = 8  # host devices forced on the CPU backend
if "jax" not in sys.modules:
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_force_host_platform_device_count={CPU_DEVICES}").strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

DISPATCH_STEP, COMPUTE_STEP = "train step, dispatch bound", "train step, compute bound"
CASES = ["tiny chained call", "numpy input", "psum", "64-leaf pytree", "in_axes=(0, None)",
         "static int arg", "matmul (n,512,512)", "out[0]", "first call", DISPATCH_STEP,
         COMPUTE_STEP]
QUICK_CASES = ["tiny chained call", "64-leaf pytree", "out[0]"]
WALL = {"matmul (n,512,512)"}  # wall time, compared as throughput
PROCESS = {"first call"}
STEPS = {DISPATCH_STEP, COMPUTE_STEP}  # wall time per step, compared as time
PER_CALL = frozenset(CASES) - WALL - PROCESS - STEPS - {"out[0]"}


@dataclasses.dataclass(frozen=True)
class Target:
  """`ours` against column `against` on `cases`: time ratio <= bound (throughput rows:
  throughput ratio >= bound)."""
  cases: frozenset[str]
  against: str
  bound: float

  def holds(self, case: str, ratios: list[float]) -> bool:
    """Does the median of the paired per-round ratios meet the bound? A parity bound
    ("no slower than", 1.00× on a time) is a claim about the rounds, not their median
    alone: two implementations doing the very same operation tie at 1.00×, and a median
    would fail half of the runs by noise. There, a median above 1.00× fails only when
    ours was slower in more rounds than chance gives (one-sided sign test at 5%)."""
    median = statistics.median(ratios)
    if case in WALL:
      return median >= self.bound
    return median <= self.bound or (self.parity and not slower_in_most_rounds(ratios))

  @property
  def parity(self) -> bool:
    return self.bound == 1.0

  def verdict(self, case: str, ratios: list[float]) -> str:
    if not ratios:
      return "n/a"
    if not self.holds(case, ratios):
      return "FAIL"
    if case not in WALL and statistics.median(ratios) > self.bound:
      return f"PASS (tie: slower in {sum(r > 1 for r in ratios)}/{len(ratios)} rounds)"
    return "PASS"

  def describe(self, case: str) -> str:
    return f"ours/{self.against} {'≥' if case in WALL else '≤'} {self.bound:.2f}×"


@dataclasses.dataclass(frozen=True)
class JaxLine:
  """What the benchmark measures on one JAX line."""
  reference: str  # the column of this line's own jax.pmap: every ratio's denominator
  shard_map: str  # module:attr behind the hand-written jit(shard_map) column
  merge_worker: bool  # a JAX_PMAP_SHMAP_MERGE=true jax.pmap column (read at import)
  targets: tuple[Target, ...]


def _on(*cases: str) -> frozenset[str]:
  return frozenset(cases)


LINES = {
    "0.6.0": JaxLine("legacy", "shard_map_impl:shard_map", True, (
        Target(_on("tiny chained call", "64-leaf pytree"), "legacy", 1.15),
        Target(_on("out[0]"), "legacy", 1.5),
        Target(_on("first call"), "legacy", 1.3),
        Target(_on("matmul (n,512,512)"), "legacy", 0.95),
        Target(frozenset(STEPS), "legacy", 1.0))),
    "0.10.2": JaxLine("jax.pmap", "jax:shard_map", False, (
        Target(PER_CALL, "jax.pmap", 1.0),
        Target(PER_CALL, "jit", 1.15),
        Target(_on("out[0]"), "jax.pmap", 1.0),
        Target(_on("first call"), "jax.pmap", 1.3),
        Target(_on("matmul (n,512,512)"), "jax.pmap", 0.95),
        Target(frozenset(STEPS), "jax.pmap", 1.0))),
}


def jax_line() -> JaxLine:
  import jax
  try:
    return LINES[jax.__version__]
  except KeyError:
    raise SystemExit(f"bench/pmap_dispatch.py: jax {jax.__version__} is not a supported "
                     f"line; run it with jax {' or '.join(LINES)}") from None


def n_devices() -> int:
  """The devices every case maps over: all local devices of JAX's default backend."""
  import jax
  return jax.local_device_count()


def _chained(f, first, *rest):
  """A step that feeds each call's output back in as the next call's first argument."""
  state = [f(first, *rest)]
  def step():
    state[0] = f(state[0], *rest)
    return state[0]
  return step


def _one_arg_cases(map1):
  """The cases that differ between implementations only in how ``map1(fun)`` maps a
  one-argument function over axis 0 of all devices."""
  import jax
  import numpy as np
  n = n_devices()
  zeros = np.zeros((n,), np.float32)

  def tiny():
    f = map1(lambda x: x + 1)
    return _chained(f, zeros)

  def numpy_input():
    f = map1(lambda x: x + 1)
    return lambda: f(zeros)

  def pytree():
    f = map1(lambda t: jax.tree.map(lambda a: a + 1, t))
    return _chained(f, {f"leaf{i:02d}": zeros for i in range(64)})

  def matmul():
    f = map1(lambda a: a @ a)
    a = f(np.full((n, 512, 512), 1e-3, np.float32))
    return lambda: f(a).block_until_ready()

  def out0():
    out = map1(lambda x: x + 1)(zeros)
    return lambda: out[0]

  def first_call():
    counter = [0]
    def step():
      counter[0] += 1
      k = float(counter[0])
      return map1(lambda x: x * 2 + k)(zeros).block_until_ready()  # a new function: cold caches
    return step

  return dict(tiny=tiny, numpy_input=numpy_input, pytree=pytree, matmul=matmul, out0=out0,
              first_call=first_call)


def _train_steps(mapped_step):
  """The two training-step cases; ``mapped_step`` maps a function of (params, x, y) over
  axis 0 of every argument, with "i" the mapped axis's name."""
  import jax

  def case(width, depth, examples):
    def setup():
      params, x, y = _mlp_data(n_devices(), width, depth, examples)
      step = mapped_step(_sgd_step)
      state = [step(params, x, y)[0]]

      def run():
        state[0] = step(state[0], x, y)[0]
        return jax.block_until_ready(state[0])
      return run
    return setup

  # (width, layers, examples per device). The compute-bound step is smaller on the CPU,
  # whose forced host devices share a few cores.
  compute = (2048, 4, 1024) if jax.default_backend() != "cpu" else (512, 4, 128)
  return dict(step_dispatch=case(128, 2, 8), step_compute=case(*compute))


def _sgd_step(params, x, y):
  """One SGD step of an MLP on this device's examples, gradients averaged over "i"."""
  import jax
  import jax.numpy as jnp

  def loss(params):
    h = x
    for w in params[:-1]:
      h = jnp.tanh(h @ w)
    return jnp.mean((h @ params[-1] - y) ** 2)

  value, grads = jax.value_and_grad(loss)(params)
  grads = jax.lax.pmean(grads, "i")
  # Rank 0 per device under pmap; shard_map's blocks keep the device axis, and so does this.
  value = jnp.reshape(jax.lax.pmean(value, "i"), jnp.shape(x)[:-2])
  return [w - 1e-3 * g for w, g in zip(params, grads, strict=True)], value


def _mlp_data(n, width, depth, examples):
  """Replicated parameters (depth square layers and a 1-wide head) and each device's batch."""
  import numpy as np
  rng = np.random.default_rng(0)
  layers = [rng.normal(0, width ** -0.5, (width, width)).astype(np.float32)
            for _ in range(depth)] + [rng.normal(0, width ** -0.5, (width, 1)).astype(np.float32)]
  params = [np.broadcast_to(w, (n, *w.shape)).copy() for w in layers]
  x = rng.normal(size=(n, examples, width)).astype(np.float32)
  return params, x, rng.normal(size=(n, examples, 1)).astype(np.float32)


def _ordered(shared, **own):
  """Case name -> setup, in CASES order."""
  cases = dict(shared, **own)
  order = ["tiny", "numpy_input", "psum", "pytree", "in_axes_none", "static_int", "matmul",
           "out0", "first_call", "step_dispatch", "step_compute"]
  return dict(zip(CASES, [cases[k] for k in order], strict=True))


def _pmap_cases(pmap):
  """Case name -> (setup() -> step callable) for a pmap-like function."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  zeros = np.zeros((n_devices(),), np.float32)

  def psum():
    f = pmap(lambda x: jax.lax.psum(x, "i"), "i")
    x = f(zeros)
    return lambda: f(x)

  def in_axes_none():
    f = pmap(lambda x, y: x + y, in_axes=(0, None))
    y = jnp.float32(2.0)
    return _chained(f, zeros, y)

  def static_int():
    f = pmap(lambda x, n: x * n, static_broadcasted_argnums=(1,))
    x = f(zeros, 1)
    return lambda: f(x, 3)

  return _ordered(_one_arg_cases(pmap), psum=psum, in_axes_none=in_axes_none,
                  static_int=static_int, **_train_steps(lambda f: pmap(f, "i")))


def _jit_cases(shard_map):
  """The same programs written by hand as jax.jit(shard_map(...)) over one mesh."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax.sharding import Mesh, PartitionSpec as P
  mesh = Mesh(np.array(jax.local_devices()), ("i",))
  zeros = np.zeros((n_devices(),), np.float32)

  mapped = P("i")

  def smap(fun, in_specs=mapped, out_specs=mapped, **jit_kwargs):
    return jax.jit(shard_map(fun, mesh=mesh, in_specs=in_specs, out_specs=out_specs),
                   **jit_kwargs)

  # Replication checking off for the training steps, as pmap has none: jax 0.6.0's
  # shard_map rejects value_and_grad of a loss computed from per-device values under it.
  check = next(name for name in ("check_vma", "check_rep")
               if name in inspect.signature(shard_map).parameters)

  def unchecked(fun):
    return jax.jit(shard_map(fun, mesh=mesh, in_specs=mapped, out_specs=mapped,
                             **{check: False}))

  def psum():
    f = smap(lambda x: jax.lax.psum(x, "i"))
    x = f(zeros)
    return lambda: f(x)

  def in_axes_none():
    f = smap(lambda x, y: x + y, in_specs=(P("i"), P()))
    y = jnp.float32(2.0)
    return _chained(f, zeros, y)

  def static_int():
    f = jax.jit(lambda x, n: shard_map(lambda a: a * n, mesh=mesh, in_specs=P("i"),
                                       out_specs=P("i"))(x), static_argnums=1)
    x = f(zeros, 1)
    return lambda: f(x, 3)

  return _ordered(_one_arg_cases(smap), psum=psum, in_axes_none=in_axes_none,
                  static_int=static_int, **_train_steps(unchecked))


def _clock(case):
  if case in WALL or case in STEPS:
    return time.perf_counter
  if case in PROCESS:
    return time.process_time if _ticks_finely(time.process_time) else time.perf_counter
  return time.thread_time if _ticks_finely(time.thread_time) else time.perf_counter


_FINE: dict = {}


def _ticks_finely(clock) -> bool:
  """Does ``clock`` advance in steps of at most 10 µs? Some hosts' CPU-time clocks tick
  per scheduler tick (milliseconds), which reads most calls as taking no time at all."""
  if clock not in _FINE:
    steps = []
    for _ in range(5):
      start = clock()
      deadline = time.perf_counter() + 0.05
      while (now := clock()) == start and time.perf_counter() < deadline:
        pass
      steps.append(now - start if now != start else math.inf)
    _FINE[clock] = statistics.median(steps) <= 1e-5
  return _FINE[clock]


def _calls_per_round(case, quick):
  if case in STEPS:
    return 5 if quick else 20
  if case in PROCESS:
    return 2 if quick else 4
  if case in WALL:
    return 3 if quick else 6
  return 100 if quick else 400


class LocalImpl:
  """An implementation timed in this process."""

  def __init__(self, name, cases):
    self.name, self._setup, self._steps = name, cases, {}

  def prepare(self, case):
    self._steps[case] = self._setup[case]()
    for _ in range(3):
      self._steps[case]()  # warm: compile, fill the C++ caches

  def step(self, case):
    return self._steps[case]

  def close(self):
    pass


class RemoteImpl:
  """An implementation timed in a worker process (for settings read at import)."""

  def __init__(self, name, env, quick):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", name]
    if quick:
      cmd.append("--quick")
    self.name = name
    self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  env={**os.environ, **env}, text=True)

  def _ask(self, **msg):
    self._proc.stdin.write(json.dumps(msg) + "\n")
    self._proc.stdin.flush()
    line = self._proc.stdout.readline()
    if not line:
      raise RuntimeError(f"{self.name} worker exited (rc={self._proc.poll()})")
    reply = json.loads(line)
    if "error" in reply:
      raise RuntimeError(reply["error"])
    return reply["value"]

  def prepare(self, case):
    self._ask(op="prepare", case=case)

  def round(self, case, n):
    return self._ask(op="round", case=case, n=n)

  def close(self):
    if self._proc.poll() is None:
      self._proc.stdin.close()
      try:
        self._proc.wait(timeout=30)
      except subprocess.TimeoutExpired:
        self._proc.kill()


def _worker(name):
  """Serves prepare/round requests for one implementation over stdin/stdout."""
  import jax
  impl = LocalImpl(name, _pmap_cases(jax.pmap))
  out = sys.stdout
  sys.stdout = sys.stderr  # keep the protocol channel clean
  for line in sys.stdin:
    msg = json.loads(line)
    try:
      value = (impl.prepare(msg["case"]) if msg["op"] == "prepare"
               else interleaved_round({name: impl.step(msg["case"])}, msg["case"], msg["n"])[name])
      out.write(json.dumps({"value": value}) + "\n")
    except Exception as e:  # pylint: disable=broad-except
      out.write(json.dumps({"error": f"{type(e).__name__}: {e}"}) + "\n")
    out.flush()


def _resolve(spec: str, default_attr: str):
  """The object named by `module:attr`."""
  import importlib
  module, _, attr = spec.partition(":")
  return getattr(importlib.import_module(module), attr or default_attr)


Results = dict[tuple[str, str], dict[int, float]]  # (impl, case) -> round -> median seconds


def paired_ratios(results: Results, name: str, against: str, case: str) -> list[float]:
  """Each round's name/against time ratio (against/name, a throughput ratio, for WALL
  rows); only rounds where both ran and took measurable time count."""
  a, b = results.get((name, case), {}), results.get((against, case), {})
  both = [r for r in sorted(a.keys() & b.keys()) if a[r] > 0 and b[r] > 0]
  return [(b[r] / a[r]) if case in WALL else (a[r] / b[r]) for r in both]


def paired_ratio(results: Results, name: str, against: str, case: str) -> float | None:
  """Median over rounds of ``paired_ratios``; None when no round has both."""
  ratios = paired_ratios(results, name, against, case)
  return statistics.median(ratios) if ratios else None


def slower_in_most_rounds(ratios: list[float]) -> bool:
  """One-sided sign test at 5%: is a time ratio above 1 in more rounds than a tie
  would give by chance? (7 rounds: all 7; 15 rounds: 12 or more.)"""
  n, k = len(ratios), sum(r > 1 for r in ratios)
  return sum(math.comb(n, i) for i in range(k, n + 1)) / 2 ** n <= 0.05


def _fmt(case, seconds):
  return f"{seconds * 1e3:.2f} ms" if case in WALL | PROCESS else f"{seconds * 1e6:.1f} µs"


def _devices_said() -> str:
  import jax
  count = jax.local_device_count()
  return f"{count} {jax.default_backend().upper()} device{'s' if count != 1 else ''}"


class Broken(Exception):
  """An implementation failed a case; ``name`` says which."""

  def __init__(self, name, error):
    super().__init__(f"{type(error).__name__}: {error}")
    self.name = name


def interleaved_round(local, case, n):
  """n timed calls of each in-process implementation (``local``: name -> step), taken
  call by call in a freshly shuffled order each time, so load that comes and goes hits
  every implementation alike. Returns name -> median seconds per call."""
  import jax
  clock = _clock(case)
  steps = list(local.items())
  times = {name: [] for name in local}
  for _ in range(n):
    random.shuffle(steps)
    for name, step in steps:
      try:
        t0 = clock()
        out = step()
        times[name].append(clock() - t0)
        # Untimed: let the devices finish, so no queue builds up (on few cores,
        # hundreds of in-flight collectives can starve XLA:CPU's thread pool).
        jax.block_until_ready(out)
      except Exception as e:  # pylint: disable=broad-except
        raise Broken(name, e) from e
  return {name: statistics.median(ts) for name, ts in times.items()}


def measure(impls, cases: list[str], rounds: int, quick: bool) -> tuple[Results, dict]:
  """Every case on every implementation, round by round. In-process implementations are
  interleaved call by call (``interleaved_round``); a worker process's block of calls
  takes a shuffled place among them."""
  results: Results = {}
  broken: dict[tuple[str, str], str] = {}
  for case in cases:
    for impl in impls:
      try:
        impl.prepare(case)
      except Exception as e:  # pylint: disable=broad-except
        broken[(impl.name, case)] = f"{type(e).__name__}: {e}"
  for r in range(rounds):
    for case in cases:
      n = _calls_per_round(case, quick)
      live = [i for i in impls if (i.name, case) not in broken]
      local = {i.name: i.step(case) for i in live if isinstance(i, LocalImpl)}
      blocks = [None] + [i for i in live if not isinstance(i, LocalImpl)]
      random.shuffle(blocks)
      for block in blocks:
        try:
          timed = (interleaved_round(local, case, n) if block is None
                   else {block.name: block.round(case, n)})
        except Broken as e:
          broken[(e.name, case)] = str(e)  # the others are timed again next round
          continue
        except Exception as e:  # pylint: disable=broad-except  # a worker's own failure
          broken[(block.name, case)] = f"{type(e).__name__}: {e}"
          continue
        for name, seconds in timed.items():
          results.setdefault((name, case), {})[r] = seconds
  return results, broken


def verdicts(line: JaxLine, results: Results, cases: list[str]
             ) -> list[tuple[str, Target, list[float]]]:
  """(case, target, ours' paired per-round ratios, empty when a column is missing) for
  every target."""
  return [(case, t, paired_ratios(results, "ours", t.against, case))
          for case in cases for t in line.targets if case in t.cases]


def print_report(line: JaxLine, names: list[str], results: Results, cases: list[str],
                 checked: list[tuple[str, Target, list[float]]]) -> None:
  ref = line.reference
  pairs = [(n, ref) for n in names if n != ref] + sorted(
      {("ours", t.against) for t in line.targets if t.against != ref and t.against in names})
  header = ("| case | " + " | ".join(names) + " | " +
            " | ".join(f"{a}/{b}" for a, b in pairs) + " | target (ours) | verdict |")
  print(header)
  print("|" + "---|" * (header.count("|") - 1))
  for case in cases:
    cells = [_fmt(case, statistics.median(results[(n, case)].values()))
             if (n, case) in results else "error" for n in names]
    ratios = [paired_ratio(results, a, b, case) for a, b in pairs]
    mine = [(t, r) for c, t, r in checked if c == case]
    verdict = ", ".join(t.verdict(case, r) for t, r in mine)
    print(f"| {case} | " + " | ".join(cells) + " | " +
          " | ".join("–" if r is None else f"{r:.2f}×" for r in ratios) + " | " +
          ", ".join(t.describe(case) for t, _ in mine) + f" | {verdict} |")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="fewer rounds and calls")
  parser.add_argument("--rounds", type=int, default=None)
  parser.add_argument("--ours", default="pmap_compat:pmap", help="module:attr of the pmap under test")
  parser.add_argument("--no-merge", action="store_true", help="skip the merge-mode worker")
  parser.add_argument("--cases", default=None, help="comma-separated subset of case numbers (1-based)")
  parser.add_argument("--shard-map", default=None,
                      help="module:attr of the shard_map used for the hand-written jit column "
                      "(default: shard_map_impl:shard_map on jax 0.6.0, jax:shard_map on 0.10.2)")
  parser.add_argument("--strict", action="store_true", help="exit status 1 when a target fails")
  parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    return _worker(args.worker)

  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  import jax
  line = jax_line()
  rounds = args.rounds or (3 if args.quick else 7)
  if args.cases:
    try:
      cases = [CASES[int(i) - 1] for i in args.cases.split(",")]
    except (ValueError, IndexError):
      parser.error(f"--cases: expected 1-based numbers up to {len(CASES)}, got {args.cases!r}")
  else:
    cases = QUICK_CASES if args.quick else CASES

  impls, failed = [LocalImpl(line.reference, _pmap_cases(jax.pmap))], {}
  try:
    impls.append(LocalImpl("ours", _pmap_cases(_resolve(args.ours, "pmap"))))
  except Exception as e:  # pylint: disable=broad-except
    failed["ours"] = f"{type(e).__name__}: {e}"
  try:
    impls.append(LocalImpl("jit", _jit_cases(_resolve(args.shard_map or line.shard_map,
                                                      "shard_map"))))
  except Exception as e:  # pylint: disable=broad-except
    failed["jit"] = f"{type(e).__name__}: {e}"
  if line.merge_worker and not (args.quick or args.no_merge):
    impls.append(RemoteImpl("merge", {"JAX_PMAP_SHMAP_MERGE": "true"}, args.quick))
  try:
    results, broken = measure(impls, cases, rounds, args.quick)
  finally:
    for impl in impls:
      impl.close()

  names = [i.name for i in impls]
  print(f"\npmap dispatch benchmark: jax {jax.__version__}, {_devices_said()}, "
        f"{rounds} rounds, medians; a/b = median over rounds of that round's ratio "
        f"(matmul: b/a, throughput)\n")
  checked = verdicts(line, results, cases)
  print_report(line, names, results, cases, checked)
  for key, err in sorted({**{(k, ""): v for k, v in failed.items()}, **broken}.items()):
    print(f"note: {key[0]} {key[1]}: {err}")
  fails = [f"{case}: {t.describe(case)} is "
           f"{f'{statistics.median(r):.2f}×' if r else 'missing'}"
           for case, t, r in checked if not r or not t.holds(case, r)]
  if fails:
    print("targets failed: " + "; ".join(fails))
  summary = [f"{case} {r:.2f}x" for case in cases
             for r in [paired_ratio(results, "ours", line.reference, case)] if r is not None]
  print(f"dispatch: pmap_compat/{line.reference}: " + (", ".join(summary) or "n/a") +
        f"; targets {len(checked) - len(fails)}/{len(checked)} PASS"
        f" (jax {jax.__version__}, {_devices_said()}, {rounds} rounds)")
  return 1 if args.strict and fails else 0


if __name__ == "__main__":
  sys.exit(main())
