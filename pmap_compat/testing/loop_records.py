"""Recording the loop iterations inside one pmap call, and checking a run against them.

`IterationRecorder` and `IterationReplayer` are the host side of `loop_steps.stepping`:
the first stores what each loop receives and each iteration returns, per device; the
second stores this run's values and hands back the recorded ones, so every iteration
computes from exactly the recorded values. `check` then compares them one by one.
Layout, inside a call's directory (calls.py)::

  loops/loops.json     {"format": ..., "loops": [Loop.as_json(), ...], "values": n}
  loops/loop_003.npz   per part p (entry, input, result; loop_steps.PARTS) and device d:
                       "paths_p_d" (int32[m, k]: the iteration of each enclosing loop, then
                       for input and result this loop's, in the order they ran) and
                       "p_d_i" (value i of those m, stacked), or "same_p_d_i" (int32: the
                       device whose p_*_i holds the same bits: replicated values once)
  stepped/             a recording of the outputs the call gave with its loops stepped

Tolerance is the per-call one, with one more way to be within it: a difference of at
most `max_ulp` ulp of the largest magnitude among the values compared together (one
part of one iteration: "ulp at part scale"). Rounding is relative to the magnitudes a
computation works with: a log-weight that is the difference of two energies near 60
moves by an ulp of 60, many of its own ulp, and the energies are among the results. The
part's scale is its largest finite magnitude: an infinity among the results (a diverging
leapfrog's energy) neither differs from itself nor hides a finite value's difference.
"""
from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from pmap_compat.testing.comparison import (BITS_DIFFER, VALUE_EQUAL, Tolerance,
                                            compare_values)
from pmap_compat.testing.loop_steps import ENTRY, PARTS, Loop

FORMAT = "pmap_compat.testing.loops/2"
LOOPS_DIR = "loops"
INDEX = "loops.json"

Key = tuple[int, str, int, tuple[int, ...]]  # (loop number, part, device, path)
_WHAT = {"entry": "on entry, value", "input": "input", "result": "result"}


class Relay:
  """The visitor a stepped site is built with: its compiled program calls back into this
  one object on every call, and each call sets `current` to that call's recorder or
  replayer. `loops` is what the last trace found (None before any)."""

  def __init__(self) -> None:
    self.current: IterationRecorder | IterationReplayer | None = None
    self.loops: list[Loop] | None = None

  def traced(self, loops: list[Loop]) -> None:
    self.loops = list(loops)

  def step(self, loop: Loop, part: str, device: int, path: tuple[int, ...],
           values: list[np.ndarray]) -> Sequence[np.ndarray]:
    if self.current is None:  # a trace-time constant evaluation, or after the call
      return values
    return self.current.step(loop, part, device, path, values)


class IterationRecorder:
  """Keeps everything the loops see and hands it back unchanged. Past `limit` bytes as
  received (before replicated values are stored once) it keeps nothing more and sets
  `overflowed`, so a long loop cannot fill the memory before the size cap is checked."""

  def __init__(self, limit: int | None = None) -> None:
    self.loops: dict[int, Loop] = {}
    self.values: dict[Key, list[np.ndarray]] = {}
    self.limit = limit
    self.received = 0
    self.overflowed = False
    self._lock = threading.Lock()  # devices call back from their own threads
    self._files: dict[int, dict[str, np.ndarray]] | None = None  # once the call is over

  def step(self, loop: Loop, part: str, device: int, path: tuple[int, ...],
           values: list[np.ndarray]) -> Sequence[np.ndarray]:
    with self._lock:
      self.received += sum(np.asarray(v).nbytes for v in values)
      if self.limit is not None and self.received > self.limit:
        self.overflowed = True
        self.values.clear()
      if not self.overflowed:
        self.loops[loop.number] = loop
        self.values[(loop.number, part, device, path)] = [np.array(v, copy=True)
                                                          for v in values]
    return values

  @property
  def iterations(self) -> int:
    return len({(key[0], key[2], key[3]) for key in self.values if key[1] != ENTRY})

  def _arrays(self) -> dict[int, dict[str, np.ndarray]]:
    """What each loop's file holds (see the module docstring)."""
    files: dict[int, dict[str, np.ndarray]] = {}
    for number in sorted(self.loops):
      arrays: dict[str, np.ndarray] = {}
      for part in PARTS:
        keys = sorted(k for k in self.values if k[:2] == (number, part))
        first: tuple[int, np.ndarray, list[np.ndarray]] | None = None
        for device in sorted({k[2] for k in keys}):
          mine = [k for k in keys if k[2] == device]
          paths = np.array([k[3] for k in mine], np.int32).reshape(len(mine), -1)
          stacks = [np.stack(v) for v in zip(*(self.values[k] for k in mine), strict=True)]
          arrays[f"paths_{part}_{device}"] = paths
          for i, stack in enumerate(stacks):
            if first is not None and np.array_equal(paths, first[1]) and _same_bits(
                stack, first[2][i]):
              arrays[f"same_{part}_{device}_{i}"] = np.array(first[0], np.int32)
            else:
              arrays[f"{part}_{device}_{i}"] = stack
          first = first or (device, paths, stacks)
      files[number] = arrays
    return files

  @property
  def bytes(self) -> int:
    """The size of what `write` stores."""
    if self._files is None:
      self._files = self._arrays()
    return sum(a.nbytes for arrays in self._files.values() for a in arrays.values())

  def write(self, call_dir: str) -> None:
    directory = os.path.join(call_dir, LOOPS_DIR)
    os.makedirs(directory, exist_ok=True)
    if self._files is None:
      self._files = self._arrays()
    for number, arrays in self._files.items():
      named: dict[str, Any] = arrays  # numpy's stubs type **kwds as allow_pickle's bool
      np.savez(os.path.join(directory, f"loop_{number:03d}.npz"), **named)
    index = {"format": FORMAT, "loops": [self.loops[n].as_json() for n in sorted(self.loops)],
             "values": len(self.values)}
    with open(os.path.join(directory, INDEX), "w", encoding="utf-8") as f:
      json.dump(index, f, indent=1)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
  return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@dataclasses.dataclass
class RecordedIterations:
  loops: dict[int, Loop]
  values: dict[Key, list[np.ndarray]]


def read(call_dir: str) -> RecordedIterations | None:
  """A call's recorded loops; None when the call held no loop (or none was stepped)."""
  directory = os.path.join(call_dir, LOOPS_DIR)
  path = os.path.join(directory, INDEX)
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    index = json.load(f)
  if index.get("format") != FORMAT:
    raise ValueError(f"{path} is not a {FORMAT} index (format {index.get('format')!r}): "
                     "record it again with this version")
  loops = {d["number"]: Loop.from_json(d) for d in index["loops"]}
  values: dict[Key, list[np.ndarray]] = {}
  for number, loop in loops.items():
    with np.load(os.path.join(directory, f"loop_{number:03d}.npz")) as stored:
      names = set(stored.files)
      for part in PARTS:
        prefix = f"paths_{part}_"
        for device in sorted(int(n[len(prefix):]) for n in names if n.startswith(prefix)):
          stacks = [stored[f"{part}_{device}_{i}"] if f"{part}_{device}_{i}" in names
                    else stored[f"{part}_{int(stored[f'same_{part}_{device}_{i}'])}_{i}"]
                    for i in range(len(loop.types[part]))]
          for row, p in enumerate(stored[prefix + str(device)]):
            values[(number, part, device, tuple(int(i) for i in p))] = [s[row] for s in stacks]
  return RecordedIterations(loops, values)


class IterationReplayer(IterationRecorder):
  """Keeps this run's values of every loop, as the recorder does, and hands back the
  recorded ones, so each iteration computes from what the recorded run's computed from."""

  def __init__(self, recorded: RecordedIterations):
    super().__init__()
    self.recorded = recorded

  def same_loop(self, loop: Loop) -> bool:
    mine = self.recorded.loops.get(loop.number)
    return mine is not None and mine.same_as(loop)

  def step(self, loop: Loop, part: str, device: int, path: tuple[int, ...],
           values: list[np.ndarray]) -> Sequence[np.ndarray]:
    super().step(loop, part, device, path, values)
    recorded = self.recorded.values.get((loop.number, part, device, path))
    if recorded is None or not self.same_loop(loop):
      return values
    return recorded


# --------------------------------------------------------------------------- checking


@dataclasses.dataclass
class IterationDifference:
  """The worst value of one part of one iteration against the recorded one."""
  loop: Loop
  part: str
  device: int
  path: tuple[int, ...]
  index: int  # the value's position in its part
  dtype: str
  shape: tuple[int, ...]
  status: str  # a comparison.VALUE_STATUSES one
  max_ulp: int
  part_ulp: float  # max finite abs difference in ulp of the part's largest finite magnitude
  max_abs: float
  detail: str = ""  # what ulp cannot say: bits of equal values, non-finite values unmatched

  @property
  def ok(self) -> bool:
    return self.status in ("within", VALUE_EQUAL)

  def describe(self) -> str:
    when = (f"entering at {_path(self.path)}" if self.part == ENTRY
            else f"iteration {_path(self.path)}")
    what = (f"{self.loop.describe()} {when} on device {self.device}, {_WHAT[self.part]} "
            f"{self.index} {self.dtype}{list(self.shape)}: ")
    if self.status in (VALUE_EQUAL, BITS_DIFFER):
      return what + f"value-equal, bits differ ({self.detail})"
    return (what + f"max ulp {self.max_ulp} ({self.part_ulp:.3g} at part scale), max abs "
            f"{self.max_abs:.3g}" + (f" ({self.detail})" if self.detail else ""))


@dataclasses.dataclass
class LoopCheck:
  """Every stepped loop of one call against the recording."""
  iterations: int = 0  # iterations whose results were compared
  identical: int = 0  # of those, with every part identical
  # The worst difference of each part that fails the tolerance (bit for bit: value-equal
  # values in other bits too).
  beyond: list[IterationDifference] = dataclasses.field(default_factory=list)
  worst: IterationDifference | None = None
  structure: list[str] = dataclasses.field(default_factory=list)

  @property
  def ok(self) -> bool:
    return not self.beyond and not self.structure

  @property
  def only_bits_differ(self) -> bool:
    """Failing only because values are equal in other bits, where bit for bit is due."""
    return (not self.structure and bool(self.beyond)
            and all(d.status == BITS_DIFFER for d in self.beyond))

  def summary(self) -> str:
    failing = {(d.loop.number, d.device, d.path): d.status for d in self.beyond
               if d.part != ENTRY}
    beyond = sum(status != BITS_DIFFER for status in failing.values())
    bits = len(failing) - beyond
    text = (f"{self.iterations} loop iterations replayed: {self.identical} identical, "
            f"{self.iterations - self.identical - len(failing)} within tolerance")
    return (text + (f", {beyond} BEYOND TOLERANCE" if beyond else "")
            + (f", {bits} NOT BIT FOR BIT (value-equal, bits differ)" if bits else ""))


def _ran(loop: Loop, part: str, path: tuple[int, ...]) -> tuple[tuple[float, float], ...]:
  """Orders what one device ran: a loop is entered before its iterations, an iteration's
  input is taken before and its result given after the loops inside it, and loops in one
  body run in the order the program holds them."""
  numbers = (*loop.enclosing, loop.number)
  levels = [(float(n), float(i)) for n, i in zip(numbers, path, strict=False)]
  if part == ENTRY:
    return (*levels, (float(loop.number), -np.inf))
  return (*levels, (-np.inf, 0.0) if part == "input" else (np.inf, 0.0))


def _path(path: tuple[int, ...]) -> str:
  """An iteration's indices, enclosing loops' first: (6, 3, 0)."""
  return "(" + ", ".join(str(i) for i in path) + ")"


def check(recorded: RecordedIterations, replayed: IterationReplayer,
          tolerance: Tolerance) -> LoopCheck:
  """Compares everything this run's loops saw with the recording."""
  result = LoopCheck()
  for number in sorted(set(recorded.loops) | set(replayed.loops)):
    was, now = recorded.loops.get(number), replayed.loops.get(number)
    if was is None and now is not None:
      result.structure.append(f"{now.describe()} is not in the recording")
    elif now is not None and was is not None and not was.same_as(now):
      result.structure.append(f"{now.describe()} differs from the recorded "
                              f"{was.describe()}: {now.as_json()} != {was.as_json()}")
  in_order = lambda k, loops: (_ran(loops[k[0]], k[1], k[3]), k[2])  # noqa: E731
  order = sorted(replayed.values, key=lambda k: in_order(k, replayed.loops))
  missing = [k for k in order if k not in recorded.values and k[0] in recorded.loops]
  unreached = sorted(set(recorded.values) - set(replayed.values),
                     key=lambda k: in_order(k, recorded.loops))
  if missing:
    loop = replayed.loops[missing[0][0]]
    result.structure.append(f"{len(missing)} loop steps ran that the recording does not have, "
                            f"the first: {_step(loop, missing[0])}")
  if unreached:
    result.structure.append(f"{len(unreached)} recorded loop steps did not run, the first: "
                            f"{_step(recorded.loops[unreached[0][0]], unreached[0])}")
  iterations: set[tuple[int, int, tuple[int, ...]]] = set()  # (loop, device, path)
  differing: set[tuple[int, int, tuple[int, ...]]] = set()
  for key in order:
    expected = recorded.values.get(key)
    loop = replayed.loops[key[0]]
    if expected is None or not replayed.same_loop(loop):
      continue
    actual = replayed.values[key]
    differences = [d for d in (_difference(loop, key, i, e, a, expected, tolerance)
                               for i, (e, a) in enumerate(zip(expected, actual, strict=True)))
                   if d is not None]
    if key[1] != ENTRY:
      iterations.add((key[0], key[2], key[3]))
    if not differences:
      continue
    if key[1] != ENTRY:
      differing.add((key[0], key[2], key[3]))
    worst = max(differences, key=_rank)
    if not worst.ok:
      result.beyond.append(worst)
    if result.worst is None or _rank(worst) > _rank(result.worst):
      result.worst = worst
  result.iterations, result.identical = len(iterations), len(iterations - differing)
  return result


def _step(loop: Loop, key: Key) -> str:
  when = f"entering at {_path(key[3])}" if key[1] == ENTRY else f"iteration {_path(key[3])}"
  return f"{loop.describe()} {when} ({key[1]}) on device {key[2]}"


def _rank(d: IterationDifference) -> tuple[bool, bool, float, float]:
  return (d.status == "beyond", not d.ok, d.part_ulp, d.max_abs)


def _difference(loop: Loop, key: Key, index: int, expected: np.ndarray, actual: np.ndarray,
                part: Sequence[np.ndarray], tolerance: Tolerance) -> IterationDifference | None:
  # At part scale: compare_values measures the difference at the part's largest finite
  # magnitude, so its verdict (non-finite values included) is the iteration's.
  stats = compare_values(expected, actual, tolerance, together=part)
  if stats["status"] == "identical":
    return None
  return IterationDifference(loop, key[1], key[2], key[3], index, str(expected.dtype),
                             tuple(expected.shape), stats["status"],
                             int(stats.get("max_ulp", 0)), float(stats.get("scale_ulp", 0.0)),
                             float(stats.get("max_abs", 0.0)), stats.get("detail", ""))
