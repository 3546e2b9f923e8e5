"""Benchmark: the codemod over a large generated tree vs libcst's own parse + metadata.

Generates a tree of realistic JAX training-code modules (a third of them with one to
three pmap sites in the usual forms, the rest without), then times, per file,
  baseline: libcst.parse_module + MetadataWrapper.resolve_many(Scope, QualifiedName,
            Position) -- the metadata the codemod needs;
  codemod:  codemod.runner.transform_file (read, parse, analyse, rewrite, diff).
Prints both totals and their ratio (target <= 1.5x), for all files and for the files
with pmap sites alone.

  .venv/bin/python bench/codemod_speed.py [--files 300] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import random
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
        start = time.perf_counter()
        fn(p)
        totals[i] += time.perf_counter() - start
    best = [min(b, t) for b, t in zip(best, totals, strict=True)]
  return best[0], best[1]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--files", type=int, default=300)
  ap.add_argument("--repeat", type=int, default=3)
  args = ap.parse_args(argv)
  options = Options(target="experimental")
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
  return 0


if __name__ == "__main__":
  sys.exit(main())
