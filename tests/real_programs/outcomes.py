"""Reading what run_mode.py wrote and comparing two runs bit for bit.

  python tests/real_programs/outcomes.py REFERENCE_DIR OTHER_DIR...

prints, for each OTHER_DIR, whether its results are bit-identical to REFERENCE_DIR's, the worst
leaf in ulp otherwise, and both runs' compiles of the program's step functions. NumPy only,
so any of the project's environments can read any run.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import program_catalog as catalog  # noqa: E402

_TOTALS = re.compile(r"(\d+) pmap sites found, (\d+) converted, (\d+) reported; (\d+) errors")


@dataclasses.dataclass
class Run:
  """One program run in one mode: its result leaves (by path) and what the runner recorded."""
  arrays: dict[str, np.ndarray]
  info: dict[str, Any]

  @property
  def program(self) -> catalog.Program:
    return catalog.PROGRAMS[self.info["program"]]

  def step_compiles(self) -> dict[str, int]:
    """Compiles of each step function (catalog's names), from JAX's compile log."""
    counts = dict.fromkeys(self.program.steps, 0)
    for name, count in self.info["compiles"].items():
      own = normalized_name(name)
      for step, aliases in self.program.steps.items():
        if own in aliases and (own != catalog.PARTIAL or name == own):
          counts[step] += count
    return counts

  def codemod_totals(self) -> tuple[int, int, int, int] | None:
    """(sites found, converted, reported, errors) from the codemod's report, in codemod mode."""
    m = _TOTALS.search(self.info.get("codemod_report") or "")
    return None if m is None else (int(m[1]), int(m[2]), int(m[3]), int(m[4]))


def normalized_name(compile_name: str) -> str:
  """The function's own name in a compile-log name: `jit(f)` and `pmap_f` give `f`."""
  m = re.fullmatch(r"jit\((.*)\)", compile_name)
  name = m.group(1) if m else compile_name
  return name[len("pmap_"):] if name.startswith("pmap_") else name


def load(out_dir: str) -> Run:
  with open(os.path.join(out_dir, "run.json"), encoding="utf-8") as f:
    info = json.load(f)
  with np.load(os.path.join(out_dir, "results.npz")) as data:
    arrays = {k: data[k] for k in data.files}
  return Run(arrays, info)


@dataclasses.dataclass
class Comparison:
  identical: bool
  differing: list[str]  # leaves whose bits differ, by path
  worst_leaf: str | None
  worst_ulp: float  # inf where shapes, dtypes or non-float values differ
  problems: list[str]  # structural differences (missing leaves, shapes, dtypes)

  def describe(self) -> str:
    if self.identical:
      return "bit-identical"
    if self.problems:
      return "; ".join(self.problems[:5])
    return (f"{len(self.differing)} leaves differ (first {self.differing[0]}); "
            f"worst {self.worst_leaf}: {self.worst_ulp:g} ulp")


def ulp_distance(a: np.ndarray, b: np.ndarray) -> float:
  """Largest distance in units in the last place between two float arrays of one dtype
  (NaN against NaN counts as equal, NaN against a number as infinite)."""
  if a.dtype.kind not in "fc":
    return 0.0 if np.array_equal(a, b) else float("inf")
  if a.dtype.kind == "c":
    return max(ulp_distance(a.real, b.real), ulp_distance(a.imag, b.imag))
  nan_a, nan_b = np.isnan(a), np.isnan(b)
  if not np.array_equal(nan_a, nan_b):
    return float("inf")
  ints = np.dtype(f"i{a.dtype.itemsize}")

  def ordered(x: np.ndarray) -> np.ndarray:
    # Sign-magnitude bits mapped onto a line where neighbouring floats differ by one.
    i = np.where(np.isnan(x), 0, x).astype(a.dtype).view(ints).astype(np.int64)
    return np.where(i < 0, np.iinfo(ints).min - i, i)

  if a.size == 0:
    return 0.0
  return float(np.max(np.abs(ordered(a) - ordered(b))))


def compare(reference: Run, other: Run) -> Comparison:
  problems = []
  for key in sorted(set(reference.arrays) ^ set(other.arrays)):
    problems.append(f"leaf {key} only in {'reference' if key in reference.arrays else 'other'}")
  differing, worst_leaf, worst = [], None, 0.0
  for key in sorted(set(reference.arrays) & set(other.arrays)):
    a, b = reference.arrays[key], other.arrays[key]
    dtype_a, dtype_b = reference.info["dtypes"][key], other.info["dtypes"][key]
    if a.shape != b.shape or dtype_a != dtype_b:
      problems.append(f"leaf {key}: {dtype_a}{list(a.shape)} vs {dtype_b}{list(b.shape)}")
      continue
    if a.tobytes() == b.tobytes():
      continue
    differing.append(key)
    # Stored bits of an ml_dtypes leaf count as integers: any difference is reported as inf.
    ulp = ulp_distance(a, b) if np.dtype(a.dtype).str == np.dtype(dtype_a).str else float("inf")
    if worst_leaf is None or ulp > worst:
      worst_leaf, worst = key, ulp
  if problems:
    worst = float("inf")
  return Comparison(not differing and not problems, differing, worst_leaf, worst, problems)


def main(argv: list[str]) -> None:
  reference = load(argv[0])
  print(f"{reference.info['program']} on jax {reference.info['jax']}, reference "
        f"{reference.info['mode']}: step compiles {reference.step_compiles()}")
  for out_dir in argv[1:]:
    other = load(out_dir)
    print(f"  {other.info['mode']:15s} {compare(reference, other).describe()}; step compiles "
          f"{other.step_compiles()}; all compiles {other.info['compiles']}")


if __name__ == "__main__":
  main(sys.argv[1:])
