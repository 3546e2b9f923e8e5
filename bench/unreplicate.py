"""Unreplicate of a Flax-ResNet-like parameter tree: legacy pmap vs the converted program.

One small program (a pmapped update of a ~160-leaf parameter tree, and Flax's
``unreplicate``: ``tree_map(lambda x: x[0], tree)``) is run three ways, side by side:

  pmap+x[0]       - the program as written: this JAX's own jax.pmap output, x[0] per leaf
                    (the reference: legacy pmap on jax 0.6.0, the shard_map-based
                    jax.pmap on 0.10.2)
  conv+x[0]       - the pmap site converted by the codemod, the old x[0] kept: on the
                    converted output's NamedSharding arrays x[0] is a gather across devices
  conv+first_rows - the program as the codemod rewrites it: ``first_rows(tree)`` (the
                    support module's read of each leaf's row 0 from its device buffer)

Rows: ``first call`` is the first unreplicate in a fresh process (compilations included;
process CPU time, which counts the compiler's threads and not other processes' load;
median over --first-reps processes), with the XLA compilations it caused (from JAX's
compile log); ``steady state`` is the median wall time of one unreplicate of the whole
tree (results ready), the three columns interleaved call by call in a shuffled order,
median over rounds of the per-round ratio. Target: conv+first_rows <= 1.2x pmap+x[0] on
both rows. The results of all three are checked bit-identical before timing.

  python bench/unreplicate.py            # a minute or two, either venv
  python bench/unreplicate.py --quick    # smoke test
The last line is a one-line summary starting with "unreplicate:".
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
import types

N_DEVICES = 8
if "jax" not in sys.modules:
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_force_host_platform_device_count={N_DEVICES}").strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import jax  # noqa: E402
import numpy as np  # noqa: E402

COLUMNS = ("pmap+x[0]", "conv+x[0]", "conv+first_rows")
TARGET = 1.2  # conv+first_rows / pmap+x[0]

PROGRAM = '''
import jax
from flax import jax_utils


@jax.pmap
def update(params):
  return jax.tree.map(lambda p: p * 0.5 + 1.0, params)


def unreplicate(tree):
  return jax_utils.unreplicate(tree)
'''

# flax.jax_utils.unreplicate, for the program as written (flax is not installed here).
FLAX_JAX_UTILS = "import jax\n\ndef unreplicate(tree):\n  return jax.tree_util.tree_map(lambda x: x[0], tree)\n"


def resnet_like_params() -> dict:
  """A Flax ResNet-34's params and batch_stats tree (channels / 4): 183 leaves."""
  rng = np.random.default_rng(0)
  params: dict = {}
  stats: dict = {}

  def conv_bn(name, kh, cin, cout):
    params[name] = {"kernel": rng.normal(size=(kh, kh, cin, cout)).astype(np.float32)}
    params[f"{name}_bn"] = {"scale": np.ones((cout,), np.float32),
                            "bias": np.zeros((cout,), np.float32)}
    stats[f"{name}_bn"] = {"mean": rng.normal(size=(cout,)).astype(np.float32),
                           "var": np.ones((cout,), np.float32)}

  conv_bn("stem", 7, 3, 16)
  cin = 16
  for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (16, 32, 64, 128), strict=True)):
    for block in range(blocks):
      prefix = f"stage{stage}_block{block}"
      conv_bn(f"{prefix}_conv1", 3, cin, width)
      conv_bn(f"{prefix}_conv2", 3, width, width)
      if cin != width:
        conv_bn(f"{prefix}_proj", 1, cin, width)
      cin = width
  params["head"] = {"kernel": rng.normal(size=(cin, 1000)).astype(np.float32),
                    "bias": np.zeros((1000,), np.float32)}
  return {"params": params, "batch_stats": stats, "step": np.int32(3)}


def _module(name: str, source: str) -> types.ModuleType:
  module = types.ModuleType(name)
  module.__file__ = f"<{name}>"
  sys.modules[name] = module
  exec(compile(source, module.__file__, "exec"), module.__dict__)
  return module


def programs() -> tuple[types.ModuleType, types.ModuleType, str]:
  """(the program as written, as the codemod converts it, the converted source)."""
  import libcst as cst

  from codemod import support_module
  from codemod.targets import installed_target
  from codemod.runner import Options, transform_module
  flax = _module("flax", "")
  vars(flax)["jax_utils"] = _module("flax.jax_utils", FLAX_JAX_UTILS)
  _module(support_module.DEFAULT_NAME, support_module.source())
  converted = transform_module(cst.parse_module(PROGRAM),
                               Options(target=installed_target())).module.code
  if "first_rows(tree)" not in converted:
    raise SystemExit(f"bench/unreplicate.py: the codemod did not rewrite unreplicate:\n{converted}")
  return _module("written", PROGRAM), _module("converted", converted), converted


def setups() -> dict:
  """Column -> (the pmapped program's output tree, the unreplicate to time)."""
  written, converted, _ = programs()
  stacked = jax.tree.map(lambda v: np.stack([v] * N_DEVICES), resnet_like_params())
  legacy_out = jax.block_until_ready(written.update(stacked))
  converted_out = jax.block_until_ready(converted.update(stacked))
  return {"pmap+x[0]": (legacy_out, written.unreplicate),
          "conv+x[0]": (converted_out, written.unreplicate),
          "conv+first_rows": (converted_out, converted.unreplicate)}


def first_call(column: str) -> dict:
  """The first unreplicate of ``column`` in this (fresh) process: CPU time, compiles."""
  from support.compiles import compiles
  out, unreplicate = setups()[column]
  with compiles() as counts:
    t0 = time.process_time()
    jax.block_until_ready(unreplicate(out))
    seconds = time.process_time() - t0
  return {"seconds": seconds, "compiles": sum(counts.values())}


def _check_identical(cases: dict) -> None:
  results = {name: jax.tree.map(np.asarray, unreplicate(out))
             for name, (out, unreplicate) in cases.items()}
  reference = results[COLUMNS[0]]
  for name, result in results.items():
    same = jax.tree.map(lambda a, b: a.dtype == b.dtype and a.shape == b.shape
                        and a.tobytes() == b.tobytes(), reference, result)
    if not all(jax.tree.leaves(same)):
      raise SystemExit(f"bench/unreplicate.py: {name} differs from {COLUMNS[0]}")


def steady_state(rounds: int, calls: int) -> dict[str, list[float]]:
  """Column -> per-round median wall time of one unreplicate, interleaved call by call."""
  cases = setups()
  _check_identical(cases)
  for out, unreplicate in cases.values():
    for _ in range(3):
      jax.block_until_ready(unreplicate(out))  # warm: compiles, caches
  medians: dict[str, list[float]] = {name: [] for name in cases}
  order = list(cases.items())
  for _ in range(rounds):
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(calls):
      random.shuffle(order)
      for name, (out, unreplicate) in order:
        t0 = time.perf_counter()
        jax.block_until_ready(unreplicate(out))
        times[name].append(time.perf_counter() - t0)
    for name, ts in times.items():
      medians[name].append(statistics.median(ts))
  return medians


def _fresh_process(column: str) -> dict:
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--first", column],
                        capture_output=True, text=True, check=False, timeout=600)
  if proc.returncode != 0:
    raise SystemExit(f"bench/unreplicate.py: the {column} worker failed:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="fewer rounds, calls and processes")
  parser.add_argument("--first-reps", type=int, default=None,
                      help="fresh processes per column for the first call (default 3, quick 1)")
  parser.add_argument("--strict", action="store_true", help="exit status 1 when a target fails")
  parser.add_argument("--first", choices=COLUMNS, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.first:
    print(json.dumps(first_call(args.first)))
    return 0
  reps = args.first_reps or (1 if args.quick else 3)
  rounds, calls = (3, 5) if args.quick else (7, 20)

  leaves = len(jax.tree.leaves(resnet_like_params()))
  firsts: dict[str, list[dict]] = {column: [] for column in COLUMNS}
  for _ in range(reps):
    for column in random.sample(COLUMNS, len(COLUMNS)):
      firsts[column].append(_fresh_process(column))
  steady = steady_state(rounds, calls)

  first_s = {c: statistics.median(r["seconds"] for r in firsts[c]) for c in COLUMNS}
  compiles = {c: statistics.median(r["compiles"] for r in firsts[c]) for c in COLUMNS}
  steady_s = {c: statistics.median(steady[c]) for c in COLUMNS}
  ref = COLUMNS[0]
  steady_ratio = {c: statistics.median(a / b for a, b in zip(steady[c], steady[ref], strict=True))
                  for c in COLUMNS}
  first_ratio = {c: first_s[c] / first_s[ref] for c in COLUMNS}

  print(f"\nunreplicate benchmark: jax {jax.__version__}, {jax.device_count()} CPU devices, "
        f"{leaves} leaves; first call: median of {reps} fresh processes; steady state: "
        f"median over {rounds} rounds of {calls} interleaved calls\n")
  print("| row | " + " | ".join(COLUMNS) + " | " +
        " | ".join(f"{c}/{ref}" for c in COLUMNS[1:]) + " |")
  print("|" + "---|" * (2 * len(COLUMNS)))
  print("| first call | " + " | ".join(f"{first_s[c] * 1e3:.1f} ms" for c in COLUMNS) + " | " +
        " | ".join(f"{first_ratio[c]:.2f}×" for c in COLUMNS[1:]) + " |")
  print("| compiles (first call) | " + " | ".join(f"{compiles[c]:g}" for c in COLUMNS) +
        " | " + " | ".join("–" for _ in COLUMNS[1:]) + " |")
  print("| steady state | " + " | ".join(f"{steady_s[c] * 1e3:.2f} ms" for c in COLUMNS) +
        " | " + " | ".join(f"{steady_ratio[c]:.2f}×" for c in COLUMNS[1:]) + " |")
  new = COLUMNS[2]
  fails = [f"{row} {ratio:.2f}×" for row, ratio in (("first call", first_ratio[new]),
                                                     ("steady state", steady_ratio[new]))
           if ratio > TARGET]
  verdict = "PASS" if not fails else "FAIL (" + ", ".join(fails) + ")"
  print(f"\nunreplicate: {new}/{ref} first call {first_ratio[new]:.2f}x, steady state "
        f"{steady_ratio[new]:.2f}x (target <= {TARGET}x: {verdict}); conv+x[0]/{ref} first call "
        f"{first_ratio[COLUMNS[1]]:.2f}x, steady state {steady_ratio[COLUMNS[1]]:.2f}x "
        f"(jax {jax.__version__}, {jax.device_count()} CPU devices, {leaves} leaves)")
  return 1 if args.strict and fails else 0


if __name__ == "__main__":
  sys.exit(main())
