"""The per-call bound, measured from JAX's own pmap (`check --per-call --calibrate`).

How far a call's outputs move across releases depends on the program: a deep network's
step rounds more than an elementwise one. Instead of a guessed --max-ulp / --atol,
`calibrate` runs the recorded program, unpatched and unconverted, under the running
release's own `jax.pmap` (legacy up to jax 0.6, JAX's shard_map-based one later) as a
per-call check against the recording (`measure`, in a fresh interpreter: the program's
module-level pmaps, the modules it imports and JAX's state are that run's own), and
takes the bound from how far that run is from the recording. The mode under test
(converted code, `pmap_compat.patched()`, or the program as it is) is then checked with
that bound.

The rule. Each value JAX's own run moved (an output leaf of a recorded call, or one part
of one loop iteration inside it: loop_records) needs, to be within an ulp bound, the
smaller of its largest elementwise ulp distance and its largest difference in ulp at
leaf scale, rounded up (at part scale for a loop's values, which `check` keeps only the
worst of). A value moved by more than half its significand bits (2**11 ulp at its scale
for float32, 2**3 for bfloat16) is rounding noise, zero but for the rounding of larger
operands that cancelled (a gradient the next BatchNorm's mean removes): no ulp bound
fits it, so its absolute difference goes to atol. Then

  atol    = MARGIN x the largest absolute difference of rounding noise (0 if none),
            rounded up to two significant digits (what is printed is what is used)
  max_ulp = max(PER_CALL_MAX_ULP, MARGIN x the largest need of the other values, but
            for those whose difference is within half the atol: bounded already), for a
            call's arguments and the values of the loops inside it
  each output leaf of a site's calls: max(PER_CALL_MAX_ULP, MARGIN x its own largest
            need over those calls); PER_CALL_MAX_ULP for a leaf JAX's own run kept

Sound: every value of JAX's own run is within it (its need is at most half the ulp
bound, or its difference at most half the atol), so the reference release's own pmap
passes; the margin leaves room for the mode under test rounding in another order by as
much again. Tight: a change that moves an output leaf by more than twice JAX's own
rounding of that leaf fails at its site, however much JAX moves another leaf (a
BatchNorm bias that is zero but for rounding does not loosen a dense layer's). When
JAX's own pmap reproduces every call bit for bit the bound is the default (bit for bit
on the recording's jax, else PER_CALL_MAX_ULP).

What no bound covers is reported, not calibrated: JAX's own run differing in the tree
structure, an integer or key leaf, a NaN or infinity, sites only one run has; the check
then fails there too unless the mode under test reproduces the recording. Calibration
is not possible, and the check keeps the default bound with a note saying why, when
JAX's own pmap cannot run the program (an API the release removed), replays no recorded
call, or when no program at hand is the recorded one: the recording keeps the sha256 of
the program's source, and a program edited since (converted in place, or changed)
would calibrate its own change into the bound. The program: `--calibrate-with ORIGINAL`
(used even if its source differs, with a note), else PROGRAM when its source is the
recorded one, else the recorded file when it still is. Only the program's own file is
compared: modules it imports are taken as they are.
"""
from __future__ import annotations

import dataclasses
import importlib.machinery
import json
import math
import os
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np

from pmap_compat.testing import recordings, trees
from pmap_compat.testing.comparison import BITS_DIFFER, VALUE_EQUAL, Tolerance, choose_tolerance
from pmap_compat.testing.per_call import PER_CALL_MAX_ULP

MARGIN = 2
MODULE = "pmap_compat.testing.calibrate"  # the measuring run: python -m MODULE


@dataclasses.dataclass
class Drift:
  """How far JAX's own pmap moved one value of one recorded call."""
  where: str
  dtype: str
  need: int  # the ulp bound it is within (elementwise or at leaf / part scale)
  max_abs: float
  noise: bool  # moved by more than half its significand bits: atol bounds it
  leaf: tuple[str, str] | None = None  # (site, path) of a call's output leaf; None: a loop's


@dataclasses.dataclass
class Measurement:
  """A per-call check of the recorded program under this release's own jax.pmap."""
  jax: str = ""
  pmap: str = ""
  program: str = ""
  source: str | None = None  # the file the checked function is defined in
  calls: int = 0  # recorded calls replayed
  identical: int = 0
  drifts: list[Drift] = dataclasses.field(default_factory=list)
  uncovered: list[str] = dataclasses.field(default_factory=list)  # beyond every bound
  error: str | None = None  # the run failed: why

  def as_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, data: dict) -> Measurement:
    drifts = [Drift(**{**d, "leaf": tuple(d["leaf"]) if d.get("leaf") else None})
              for d in data.pop("drifts", [])]
    return cls(**data, drifts=drifts)


@dataclasses.dataclass
class Calibration:
  """The bound the mode under test is checked with, and the lines that explain it."""
  tolerance: Tolerance | None  # None: not calibrated, the default bound applies
  lines: list[str]
  measurement: Measurement | None = None

  @property
  def text(self) -> str:
    return "\n".join(self.lines)


# --------------------------------------------------------------------------- measuring


def _significand_bits(dtype: str) -> int | None:
  """The explicit significand bits of a floating dtype's name; None for other dtypes."""
  import ml_dtypes  # pylint: disable=import-outside-toplevel
  try:
    dt = np.dtype(dtype)
    info: Any = ml_dtypes.finfo(dt) if dt.kind == "V" else np.finfo(dt)
  except (TypeError, ValueError):
    return None
  return int(info.nmant)


def _drift(where: str, dtype: str | None, max_ulp: int | None, scale_ulp: float | None,
           max_abs: float | None) -> Drift | None:
  """None where no ulp bound or atol fits (a value that is not floating, a NaN or an
  infinity matching nothing)."""
  bits = _significand_bits(dtype or "")
  if bits is None or max_ulp is None or max_abs is None or not math.isfinite(max_abs):
    return None
  need = min(max_ulp, math.ceil(scale_ulp or 0.0))
  return Drift(where, str(dtype), need, max_abs, need > 2 ** (bits // 2))


def _collect(replayer: Any, measurement: Measurement) -> None:
  """Every value JAX's own run moved, from a Replayer that checked with max_ulp 0."""
  from pmap_compat.testing import per_call  # pylint: disable=import-outside-toplevel
  report: per_call.PerCallReport = replayer.report()
  drifts, uncovered = measurement.drifts, measurement.uncovered
  for result in report.results:
    call = f"site {result.site} call {result.index}"
    measurement.calls += 1
    measurement.identical += result.outputs.worst is None and (
        result.loops is None or result.loops.worst is None)
    for problem in result.inputs.structure[:1] + result.outputs.structure[:1]:
      uncovered.append(f"{call}: {problem}")
    for leaf in result.outputs.leaves:
      where = f"{call}, leaf {trees.display_path(leaf.path)}"
      if leaf.status == "identical":
        continue
      if leaf.status in (VALUE_EQUAL, BITS_DIFFER):  # within any bound that is not exact
        drifts.append(Drift(where, str(leaf.dtype), 0, 0.0, False))
        continue
      drift = _drift(where, leaf.dtype, leaf.max_ulp, leaf.scale_ulp, leaf.max_abs)
      if drift is None:
        uncovered.append(f"{where}: " + (leaf.difference() if leaf.max_abs is not None
                                         else f"{leaf.status}: {leaf.detail}"))
      else:
        drift.leaf = (result.site, trees.display_path(leaf.path))
        drifts.append(drift)
    loops = result.loops
    if loops is None:
      continue
    uncovered += [f"{call}: {problem}" for problem in loops.structure[:1]]
    for worst in loops.beyond:  # each differing part's worst value (max_ulp 0: all differ)
      where = f"{call}, {worst.describe().split(': ', 1)[0]}"
      if worst.status in (VALUE_EQUAL, BITS_DIFFER):
        drifts.append(Drift(where, worst.dtype, 0, 0.0, False))
        continue
      # At part scale only: the part's other values share its scale, not its elementwise ulp.
      drift = _drift(where, worst.dtype, math.ceil(worst.part_ulp), worst.part_ulp,
                     worst.max_abs)
      if drift is None:
        uncovered.append(worst.describe())
      else:
        drifts.append(drift)
  uncovered += [f"recorded site {e.key} ({e.where}) was never reached"
                for e in report.never_reached]
  uncovered += [f"site {r.site.key} ({r.site.where}) was reached but never recorded"
                for r in report.never_recorded]


def measure(program: str, against: str, function: str = "run",
            kwargs: dict | None = None) -> Measurement:
  """Runs `program` as it is, per call against the recording (in this process)."""
  # pylint: disable=import-outside-toplevel
  from pmap_compat.testing import per_call, programs
  measurement = Measurement(program=program)
  try:
    with per_call.checking_calls(against, max_ulp=0) as replayer:
      fn = programs.find_function(programs.load_program(program), function)
      measurement.source = programs.source_file(fn)
      programs.run(fn, dict(kwargs or {}))
    _collect(replayer, measurement)
  except Exception as e:  # pylint: disable=broad-except
    measurement.error = f"{type(e).__name__}: {e}"
  measurement.jax = recordings.jax_versions()["jax"]
  measurement.pmap = recordings.which_pmap()
  return measurement


def _measure_in_child(program: str, against: str, function: str, kwargs: dict) -> Measurement:
  """`measure` in a fresh interpreter of this one's kind."""
  import pmap_compat  # pylint: disable=import-outside-toplevel
  root = os.path.dirname(os.path.dirname(os.path.abspath(pmap_compat.__file__)))
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
  with tempfile.TemporaryDirectory(prefix="pmap-calibrate-") as tmp:
    out = os.path.join(tmp, "measurement.json")
    command = [sys.executable, *(f"-W{w}" for w in sys.warnoptions), "-m", MODULE,
               program, "--against", against, "--function", function,
               "--kwargs", json.dumps(kwargs), "--out", out]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if os.path.exists(out):
      with open(out, encoding="utf-8") as f:
        return Measurement.from_json(json.load(f))
  tail = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines()
          or ["(no output)"])[-1]
  return Measurement(program=program, error=f"the run exited {proc.returncode}: {tail}")


# --------------------------------------------------------------------------- the bound


def round_up(x: float) -> float:
  """`x` rounded up to two significant digits."""
  if x <= 0.0 or not math.isfinite(x):
    return x
  step = 10.0 ** (math.floor(math.log10(x)) - 1)
  value = float(f"{math.ceil(x / step) * step:.2g}")
  while value < x:
    value = float(f"{value + step:.2g}")
  return value


def _reported(x: float) -> float:
  return float(f"{x:.3g}")


@dataclasses.dataclass
class Bound:
  """The rule's outcome, and the values of JAX's own run that set it."""
  tolerance: Tolerance
  worst_ulp: Drift | None = None  # the largest need among the values max-ulp bounds
  worst_noise: Drift | None = None  # the largest difference of rounding noise
  noise: int = 0  # values of rounding noise
  under_atol: int = 0  # other values the atol already bounds twice over


def bound(measurement: Measurement, default: Tolerance) -> Bound:
  """The rule (module docstring) applied to what JAX's own run moved."""
  drifts = measurement.drifts
  if not drifts:
    return Bound(default)
  noise = [d for d in drifts if d.noise]
  worst_noise = max(noise, key=lambda d: d.max_abs, default=None)
  own_abs = worst_noise.max_abs if worst_noise else 0.0
  # From the larger of the value and the printed one: each printed number, doubled,
  # is within the printed bound.
  atol = round_up(MARGIN * max(own_abs, _reported(own_abs)))
  # Values the atol bounds with the margin already need no ulp bound (small values that
  # cancel partly): they would only loosen max-ulp for every other value.
  moved = [d for d in drifts if not d.noise and d.need]
  rest = [d for d in moved if MARGIN * d.max_abs > atol]
  worst_ulp = max(rest, key=lambda d: d.need, default=None)
  own_ulp = worst_ulp.need if worst_ulp else 0
  # Each output leaf by its own drift (over the site's calls): a leaf JAX's own run moves
  # little stays tight however much it moves another.
  leaves: dict[tuple[str, str], int] = {}
  for d in rest:
    if d.leaf is not None:
      leaves[d.leaf] = max(leaves.get(d.leaf, 0), PER_CALL_MAX_ULP, MARGIN * d.need)
  tolerance = Tolerance(False, max(PER_CALL_MAX_ULP, MARGIN * own_ulp), 0.0, atol,
                        why=f"calibrated from jax.pmap {measurement.jax}'s own drift on this "
                        "program", leaves=leaves, leaf_default=PER_CALL_MAX_ULP)
  return Bound(tolerance, worst_ulp, worst_noise, len(noise), len(moved) - len(rest))


# --------------------------------------------------------------------------- the program


def _module_file(name: str) -> str | None:
  """The source file of a dotted module name, found without importing anything."""
  path: list[str] | None = None
  spec = None
  for part in name.split("."):
    spec = importlib.machinery.PathFinder.find_spec(part, path if path is not None
                                                    else [os.getcwd(), *sys.path])
    if spec is None:
      return None
    path = list(spec.submodule_search_locations or [])
  return spec.origin if spec is not None and spec.has_location else None


def program_file(program: str) -> str | None:
  """PROGRAM's source file, as `programs.load_program` would import it."""
  if program.endswith(".py") or os.sep in program:
    return os.path.abspath(program)
  return _module_file(program)


def _read_producer(against: str) -> dict:
  """The recording's producer, without asking JAX which process this is (that would start
  its backends before a multi-process program initializes jax.distributed)."""
  for directory in (against, recordings.process_directory(against, 0, 2)):
    if os.path.exists(os.path.join(directory, recordings.MANIFEST)):
      return recordings.read_producer(directory)
  recordings.require(against)  # raises, naming what is missing
  return {}


def choose_program(program: str, recorded: dict,
                   calibrate_with: str | None) -> tuple[str | None, list[str]]:
  """The program to calibrate with (None: none can be) and notes: why not, or a warning."""
  digest = recorded.get("program_sha256")
  if calibrate_with is not None:
    mine = recordings.source_digest(program_file(calibrate_with))
    if digest is not None and mine != digest:
      return calibrate_with, [f"note: {calibrate_with} is not the recorded program's source "
                              "(its sha256 differs): a change of its arithmetic is "
                              "calibrated into the bound"]
    return calibrate_with, []
  if digest is None:
    return None, ["the recording keeps no digest of its program's source (recorded before "
                  "check --calibrate existed, or from no file): record it again, or give the "
                  "recorded program with --calibrate-with ORIGINAL"]
  if "not call pmap" in str(recorded.get("produced_by")):
    return None, ["the recording was made from code that does not call pmap: give the pmap "
                  "program it was converted from with --calibrate-with ORIGINAL"]
  where = str(recorded.get("program"))
  for candidate in (program, where):
    if recordings.source_digest(program_file(candidate)) == digest:
      return candidate, []
  ask = ("a run of other source would take its changes into the bound: give the recorded "
         "version with --calibrate-with ORIGINAL")
  if not os.path.isfile(where):
    return None, [f"PROGRAM is not the recorded source and the recorded program {where} is "
                  f"gone; {ask}"]
  mine = program_file(program)
  if mine is not None and os.path.realpath(mine) == os.path.realpath(where):
    return None, [f"{where} changed since it was recorded (converted in place, or edited); "
                  + ask]
  return None, [f"neither PROGRAM nor the recorded program {where} (changed since) is the "
                f"recorded source; {ask}"]


# --------------------------------------------------------------------------- calibrating


def _describe(tolerance: Tolerance) -> str:
  return f"--max-ulp {tolerance.max_ulp} --atol {tolerance.atol:g}"


def calibrate(program: str, against: str | os.PathLike, *, function: str = "run",
              kwargs: dict | None = None, calibrate_with: str | None = None) -> Calibration:
  """Measures JAX's own drift on the recorded program and derives the per-call bound."""
  against = os.fspath(against)
  recorded = _read_producer(against)
  default = choose_tolerance(recorded, recordings.jax_versions(),
                             cross_version_max_ulp=PER_CALL_MAX_ULP)
  fallback = f"the per-call bound stays the default: {default.describe()}"
  chosen, notes = choose_program(program, recorded, calibrate_with)
  if chosen is None:
    return Calibration(None, [f"calibration not possible: {notes[0]}; {fallback}"])
  m = _measure_in_child(chosen, against, function, dict(kwargs or {}))
  pmap = f"jax.pmap {m.jax or recordings.jax_versions()['jax']}"
  if m.error is not None:
    return Calibration(None, [*notes, f"calibration not possible: {chosen} does not run on jax "
                              f"{m.jax} under {m.pmap}: {m.error.rstrip('.')}; {fallback}"], m)
  if not m.calls:
    return Calibration(None, [*notes, f"calibration not possible: {chosen} under {pmap} "
                              f"replayed no recorded call; {fallback}"], m)
  if calibrate_with is None and recordings.source_digest(m.source) != recorded.get(
      "program_sha256"):  # PROGRAM named a module: what it imported is what counts
    return Calibration(None, [f"calibration not possible: {chosen} ran {m.source}, not the "
                              f"recorded source; {fallback}"], m)
  lines = [*notes, f"calibrating: {chosen} on jax {m.jax} under {m.pmap}, unpatched, per "
           f"call against the recording: {m.calls} recorded calls, {m.identical} identical"]
  chosen_bound = bound(m, default)
  if not m.drifts:
    how = ("differs only where no bound reaches (see the note)" if m.uncovered
           else "reproduces every recorded call bit for bit")
    lines.append(f"calibrated per-call bound: JAX's own pmap {how}, so the bound is the "
                 f"default: {default.describe()}")
  else:
    own_ulp, own_abs = chosen_bound.worst_ulp, chosen_bound.worst_noise
    each = chosen_bound.tolerance.leaves or {}
    lines += [
        f"calibrated per-call bound from {pmap}'s own drift on this program: "
        f"{_describe(chosen_bound.tolerance)} (JAX's own: max {own_ulp.need if own_ulp else 0} "
        f"ulp, max abs {own_abs.max_abs if own_abs else 0.0:.3g} in rounding noise)",
        "  JAX's own largest ulp difference (elementwise or at leaf / part scale): "
        + (f"{own_ulp.need} ulp, {own_ulp.where}" if own_ulp else "none"),
        "  JAX's own rounding noise (values moved by more than half their significand "
        "bits, bounded absolutely): " + (f"max abs {own_abs.max_abs:.3g}, {own_abs.where} "
                                         f"({chosen_bound.noise} values)" if own_abs else "none")
        + (f"; {chosen_bound.under_atol} other values within half the atol set no ulp bound"
           if chosen_bound.under_atol else ""),
        f"  rule: max-ulp = max({PER_CALL_MAX_ULP}, {MARGIN} x JAX's own ulp), atol = "
        f"{MARGIN} x JAX's own rounding noise rounded up; JAX's own pmap is within it, and "
        "a change beyond twice its rounding is not",
        f"  each output leaf of a call by JAX's own ulp on that leaf: max({PER_CALL_MAX_ULP}, "
        f"{MARGIN} x it), up to {max(each.values(), default=PER_CALL_MAX_ULP)} "
        f"ulp on the {len(each)} leaves it moved, {PER_CALL_MAX_ULP} "
        "on the others; the max-ulp above bounds arguments and loop values (and is what "
        "--max-ulp would give every value)"]
  if m.uncovered:
    lines.append(f"note: JAX's own pmap also differs from the recording beyond any bound in "
                 f"{len(m.uncovered)} places (these fail below too unless the mode under test "
                 f"reproduces the recording), the first: {m.uncovered[0]}")
  return Calibration(chosen_bound.tolerance, lines, m)


def _main(argv: list[str] | None = None) -> int:
  """The measuring run: `python -m pmap_compat.testing.calibrate PROGRAM --against DIR
  --out JSON [--function NAME] [--kwargs JSON]` (`calibrate` starts it)."""
  import argparse  # pylint: disable=import-outside-toplevel
  from pmap_compat.testing import programs  # pylint: disable=import-outside-toplevel
  parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
  parser.add_argument("program")
  parser.add_argument("--against", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--function", default="run")
  parser.add_argument("--kwargs", default="{}")
  args = parser.parse_args(argv)
  try:
    m = measure(args.program, args.against, args.function, json.loads(args.kwargs))
    with open(args.out, "w", encoding="utf-8") as f:
      json.dump(m.as_json(), f)
  finally:
    programs.shutdown_distributed()
  return 0


if __name__ == "__main__":
  sys.exit(_main())
