"""Benchmark: the codemod over a large generated tree vs libcst's own parse + metadata.

Generates a tree of realistic JAX training-code modules (a third of them with one to
three pmap sites in the usual forms, the rest without), then times, per file,
  baseline: libcst.parse_module + MetadataWrapper.resolve_many(Scope, QualifiedName,
            Position) -- the metadata the codemod needs;
  codemod:  codemod.runner.transform_file (read, parse, analyse, rewrite, diff).
Times are CPU seconds of this process (``time.process_time``: single-threaded work, so on
an idle machine the wall time, and unlike it unaffected by other load on a shared one).
Prints both totals and their ratio (target <= 1.5x), for all files and for the files
with pmap sites alone. Then the same for real files, one by one (the median of
``--real-repeat`` paired runs): JAX's own tests/pmap_test.py at a pinned tag (from
../shared/jax_tests beside the repository; skipped with a note where that is absent), a
Flax trainer (the repository's copy of the ImageNet example's loop), Flax's own
``nnx/transforms/iteration.py`` (its ``nnx.pmap``; where flax is installed) and a brax
trainer (an installed brax's PPO trainer, else the repository's program).

  .venv/bin/python bench/codemod_speed.py [--files 300] [--repeat 3] [--real-repeat 7]
                                          [--only tree|real]
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import random
import statistics
import sys
import tempfile
import time

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider, QualifiedNameProvider, ScopeProvider

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from codemod.runner import Options, transform_file  # noqa: E402

_HEADER = '''"""Generated module {n}: model code of the usual shape."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
'''

_BLOCK = '''

class Layer{n}:
  """A dense layer with a few helpers."""

  def __init__(self, width, depth=2, scale=0.{n}):
    self.width = width
    self.depth = depth
    self.scale = scale

  def init(self, key):
    keys = jax.random.split(key, self.depth)
    return [jax.random.normal(k, (self.width, self.width)) * self.scale for k in keys]

  def apply(self, params, x):
    for w in params:
      x = jnp.tanh(x @ w)  # a comment about the activation
    return x


def loss_{n}(params, x, y, layer=Layer{n}(8)):
  pred = layer.apply(params, x)
  err = pred - y
  return jnp.mean(err ** 2) + 1e-4 * sum(jnp.sum(w ** 2) for w in params)


def batches_{n}(data, size):
  for start in range(0, len(data), size):
    chunk = data[start:start + size]
    if len(chunk) < size:
      break
    yield {{"x": chunk[:, :-1], "y": chunk[:, -1:]}}
'''

_SITES = [
    '''

@functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0,))
def train_step_{n}(params, x, y):
  grads = jax.grad(loss_{n})(params, x, y)
  grads = jax.lax.pmean(grads, "batch")
  return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
''',
    '''

def make_eval_{n}():
  return jax.pmap(lambda p, x, y: jax.lax.pmean(loss_{n}(p, x, y), "d"), "d",
                  in_axes=(None, 0, 0), out_axes=None)
''',
    '''

@jax.pmap
def normalise_{n}(x):
  return (x - x.mean()) / (x.std() + 1e-6)
''',
]


def generate(root: str, files: int, seed: int = 0) -> tuple[list[str], list[str]]:
  rng = random.Random(seed)
  all_paths, with_sites = [], []
  for i in range(files):
    sub = os.path.join(root, f"pkg{i % 10}")
    os.makedirs(sub, exist_ok=True)
    parts = [_HEADER.format(n=i)]
    for b in range(6):
      parts.append(_BLOCK.format(n=f"{i}_{b}"))
    has_sites = i % 3 == 0
    if has_sites:
      for template in rng.sample(_SITES, rng.randint(1, 3)):
        parts.append(template.format(n=f"{i}_0"))
    path = os.path.join(sub, f"mod{i}.py")
    with open(path, "w", encoding="utf-8") as f:
      f.write("".join(parts))
    all_paths.append(path)
    if has_sites:
      with_sites.append(path)
  return all_paths, with_sites


def baseline(path: str) -> None:
  with open(path, "rb") as f:
    module = cst.parse_module(f.read())
  MetadataWrapper(module).resolve_many([ScopeProvider, QualifiedNameProvider, PositionProvider])


def time_pair(first, second, paths: list[str], repeat: int) -> tuple[float, float]:
  """Best-of-``repeat`` totals, the two alternating file by file so that load on a
  shared machine hits both alike."""
  best = [float("inf"), float("inf")]
  for _ in range(repeat):
    totals = [0.0, 0.0]
    for p in paths:
      for i, fn in enumerate((first, second)):
        start = time.process_time()
        fn(p)
        totals[i] += time.process_time() - start
    best = [min(b, t) for b, t in zip(best, totals, strict=True)]
  return best[0], best[1]


_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JAX_TAG = "v0.6.0"  # the pinned JAX release whose tests/pmap_test.py is timed
_PROGRAMS = os.path.join(_REPO, "tests", "real_programs", "programs")


def _installed(package: str, relative: str) -> str | None:
  """``relative`` inside an installed ``package`` (of this interpreter), if there."""
  try:
    spec = importlib.util.find_spec(package)
  except (ImportError, ValueError):
    return None
  if spec is None or not spec.submodule_search_locations:
    return None
  path = os.path.join(list(spec.submodule_search_locations)[0], relative)
  return path if os.path.isfile(path) else None


def real_files() -> tuple[list[tuple[str, str]], list[str]]:
  """(label, path) of each real file to time, and a note for each one that is missing."""
  found, missing = [], []
  jax_test = os.path.join(_REPO, os.pardir, "shared", "jax_tests", JAX_TAG, "tests",
                          "pmap_test.py")
  if os.path.isfile(jax_test):
    found.append((f"JAX {JAX_TAG} tests/pmap_test.py", os.path.normpath(jax_test)))
  else:
    missing.append(f"JAX {JAX_TAG} tests/pmap_test.py skipped: {os.path.normpath(jax_test)} "
                   "is absent (a checkout of JAX's tests at that tag goes there)")
  # A Flax trainer (the ImageNet example's loop), Flax's own module with `nnx.pmap`, and a
  # brax trainer: installed files where an installed package has them.
  found.append(("Flax trainer tests/real_programs/programs/flax_imagenet.py",
                os.path.join(_PROGRAMS, "flax_imagenet.py")))
  for label, package, relative, program in (
      ("Flax", "flax", os.path.join("nnx", "transforms", "iteration.py"), None),
      ("brax", "brax", os.path.join("training", "agents", "ppo", "train.py"), "brax_ppo.py")):
    path = _installed(package, relative)
    if path is not None:
      found.append((f"{label} {package}/{relative} (installed)", path))
    elif program is not None:
      found.append((f"{label} trainer tests/real_programs/programs/{program}",
                    os.path.join(_PROGRAMS, program)))
    else:
      missing.append(f"{label} {package}/{relative} skipped: {package} is not installed")
  return found, missing


def time_real(path: str, options: Options, repeat: int) -> tuple[float, float, float]:
  """Medians over ``repeat`` paired runs (baseline then codemod, so that load on a shared
  machine hits both alike): baseline seconds, codemod seconds, and their ratio."""
  base, ours, ratios = [], [], []
  for _ in range(repeat):
    timed = []
    for fn in (baseline, lambda p: transform_file(p, options)):
      gc.collect()  # neither pays for collecting the other's (or an earlier file's) garbage
      start = time.process_time()
      fn(path)
      timed.append(time.process_time() - start)
    base.append(timed[0])
    ours.append(timed[1])
    ratios.append(timed[1] / timed[0])
  return statistics.median(base), statistics.median(ours), statistics.median(ratios)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--files", type=int, default=300)
  ap.add_argument("--repeat", type=int, default=3)
  ap.add_argument("--real-repeat", type=int, default=7)
  ap.add_argument("--only", choices=("tree", "real"), help="time only the generated tree "
                  "or only the real files (default: both)")
  args = ap.parse_args(argv)
  options = Options(target="experimental")
  if args.only != "real":
    _time_tree(args, options)
  if args.only != "tree":
    _time_real_files(args, options)
  return 0


def _time_real_files(args, options: Options) -> None:
  files, missing = real_files()
  for note in missing:
    print(f"note: {note}")
  print(f"real files (median of {args.real_repeat} paired runs):")
  for label, path in files:
    result = transform_file(path, options)  # warms up, and counts the sites
    assert not result.internal_error, result.findings
    lines = sum(1 for _ in open(path, encoding="utf-8"))
    base, ours, ratio = time_real(path, options, args.real_repeat)
    print(f"  {label} ({lines} lines, {result.sites_found} pmap sites, "
          f"{result.sites_converted} converted): libcst parse+metadata {base:.2f}s, "
          f"codemod {ours:.2f}s, ratio {ratio:.2f}x")


def _time_tree(args, options: Options) -> None:
  with tempfile.TemporaryDirectory() as root:
    paths, with_sites = generate(root, args.files)
    lines = sum(sum(1 for _ in open(p, encoding="utf-8")) for p in paths)
    converted = [transform_file(p, options) for p in with_sites]
    assert all(r.changed and not r.internal_error for r in converted)
    sites = sum(r.sites_converted for r in converted)
    print(f"tree: {len(paths)} files, {lines} lines, {len(with_sites)} files with "
          f"{sites} pmap sites (all converted)")
    for label, subset in (("all files", paths), ("files with sites", with_sites)):
      base, ours = time_pair(baseline, lambda p: transform_file(p, options), subset,
                             args.repeat)
      print(f"{label:>17}: libcst parse+metadata {base:.2f}s, codemod {ours:.2f}s, "
            f"ratio {ours / base:.2f}x")


if __name__ == "__main__":
  sys.exit(main())
