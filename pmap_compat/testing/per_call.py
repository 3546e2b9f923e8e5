"""Per-call record and replay: each pmap site checked in isolation, so nothing compounds.

`Recorder` (an observer for `sites.observing`) stores the inputs and outputs of each
site's first K calls and counts every call. `Replayer` runs the program again, possibly
on another JAX and another implementation (JAX's own pmap, `pmap_compat`, the codemod's
output); at each recorded call it runs the site on the recorded inputs (placed like the
program's own arguments), compares the outputs with the recorded ones, and hands the
recorded outputs back (placed like the implementation's outputs, so the program gets
the arrays and shardings it expects), so the run follows the recorded trajectory and a
difference in one call cannot grow in the next. Calls after the K-th run as they are.
A site holding loops is built again with its loops stepped (`SteppedSites`), so that the
same is done for every loop iteration inside a recorded call (loop_records).

Differences are measured as in the end-to-end check (`comparison`); the default
tolerance is bit for bit on the recording's own jax/jaxlib and `PER_CALL_MAX_ULP`
across versions (see there).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from typing import Any
from collections.abc import Callable, Iterator

import jax
import numpy as np

from pmap_compat.testing import calls, loop_records, recordings, sites, trees
from pmap_compat.testing.comparison import (VALUE_STATUSES, LeafReport, Report, Tolerance,
                                            choose_tolerance, compare)

# Default per-call bound across jax/jaxlib versions. One call of a site has no loop to
# compound rounding: measured from legacy jax.pmap on jax 0.6.0 to jax 0.10.2 (its own
# jax.pmap, pmap_compat.patched() and the codemod output alike) at most 3 ulp at leaf scale
# on the shipped examples (dropout_prng; end to end they reach 7); twice that is the bound.
# Deep networks round more within one step (a ResNet18 train step: 23 ulp at leaf scale,
# and gradients that are zero but for rounding differ absolutely): `check --calibrate`
# measures their bound from JAX's own pmap on the program (calibrate.py). The same bound
# holds each loop iteration inside a call (loop_records: numpyro NUTS, 3356 iterations of
# 8 chains, at most 1 ulp at part scale from 0.6.0 to 0.10.2, 3330 of them identical).
PER_CALL_MAX_ULP = 6


def _process_directory(directory: str) -> str:
  return recordings.process_directory(directory, jax.process_index(), jax.process_count())


class Recorder:
  """Stores the first `calls_per_site` calls of every site (observer for sites.observing).

  With `step_loops`, a stored call whose site holds loops also runs once more, built
  again with its loops stepped (loop_steps), and what every loop received and every
  iteration returned is stored with the outputs of that run. The program gets the
  outputs of its own call.
  """

  def __init__(self, directory: str, calls_per_site: int = calls.DEFAULT_CALLS,
               max_bytes: int = calls.DEFAULT_MAX_BYTES, step_loops: bool = True):
    self.directory = os.fspath(directory)
    self.writer = calls.Writer(calls_per_site, max_bytes, near=self.directory)
    self.step_loops = step_loops
    self.stepped = SteppedSites()
    self.active = False

  def call(self, caller: sites.SiteCaller, args: tuple, kwargs: dict) -> Any:
    entry, index = self.writer.called(caller.site)
    if index >= self.writer.calls_per_site:
      return caller.implementation(*args, **kwargs)
    inputs = calls.host_leaves((args, kwargs))  # before the call may donate them
    stepped = None
    if self.step_loops:
      # Replicated values are stored once: as received they may take up to one copy per
      # device of what the cap leaves.
      room = self.writer.max_bytes - self.writer.bytes
      iterations = loop_records.IterationRecorder(limit=room * jax.local_device_count())
      out = self.stepped.run(caller, iterations, args, kwargs)
      if out is not None:
        stepped = calls.Stepped(iterations, calls.host_leaves(out))
    out = jax.block_until_ready(caller.implementation(*args, **kwargs))
    self.writer.store(entry, index, inputs, calls.host_leaves(out), stepped)
    return out

  def save(self) -> str:
    """Moves the stored calls into this process's part of the recording."""
    return self.writer.save(_process_directory(self.directory))


class SteppedSites:
  """Each site built again with its loops stepped, once, and run with a call's visitor."""

  def __init__(self) -> None:
    self._built: dict[str, tuple[Callable[..., Any], loop_records.Relay]] = {}
    self.why_not: dict[str, str] = {}  # site key -> why its calls run whole

  def run(self, caller: sites.SiteCaller, visitor: Any, args: tuple,
          kwargs: dict) -> Any | None:
    """The call's outputs with `visitor` seeing every loop iteration; None when the site
    holds no loop or cannot be built again (`why_not` says which)."""
    key = caller.site.key
    if key in self.why_not or (key not in self._built and not self._build(caller, args,
                                                                           kwargs)):
      return None
    stepped, relay = self._built[key]
    relay.current = visitor
    try:
      out = jax.block_until_ready(stepped(*args, **kwargs))
    except Exception as e:  # pylint: disable=broad-except
      self._give_up(caller, e)
      return None
    finally:
      relay.current = None
    if not relay.loops:
      self.why_not[key] = "it holds no loop"
      del self._built[key]
      return None
    return out

  def _build(self, caller: sites.SiteCaller, args: tuple, kwargs: dict) -> bool:
    key = caller.site.key
    if caller.stepped is None:
      self.why_not[key] = ("this implementation cannot step its loops (converted code in the "
                           "on_pmap_mesh form, which nothing rebuilds over a stepped "
                           "function)")
      return False
    relay = loop_records.Relay()
    try:
      stepped: Any = caller.stepped(relay)
    except Exception as e:  # pylint: disable=broad-except
      self._give_up(caller, e)
      return False
    try:
      # Traces without compiling: a site without loops is not compiled twice. (Some
      # arguments cannot be lowered: a pytree class that checks its fields rejects
      # lowering's placeholders. Then the first call tells.)
      stepped.lower(*args, **kwargs)
    except Exception:  # pylint: disable=broad-except
      relay.loops = None
    if relay.loops is not None and not relay.loops:
      self.why_not[key] = "it holds no loop"
      return False
    self._built[key] = (stepped, relay)
    return True

  def _give_up(self, caller: sites.SiteCaller, error: Exception) -> None:
    key = caller.site.key
    self._built.pop(key, None)
    self.why_not[key] = f"its loops could not be stepped ({type(error).__name__}: {error})"
    warnings.warn(f"pmap site {key} ({caller.site.where}): {self.why_not[key]}; its calls "
                  "are checked whole", stacklevel=3)


@contextlib.contextmanager
def recording_calls(directory: str | os.PathLike, *, calls_per_site: int = calls.DEFAULT_CALLS,
                    max_bytes: int = calls.DEFAULT_MAX_BYTES,
                    step_loops: bool = True) -> Iterator[Recorder]:
  """Records the calls of every pmap site created in the block into `directory`/calls.

  Import (or define) the program inside the block, so that its module-level pmaps are
  observed, and write the recording itself (`record`) inside it too: the calls are moved
  into the recording's directory when the block ends without an exception.
  """
  recorder = Recorder(os.fspath(directory), calls_per_site, max_bytes, step_loops)
  try:
    with sites.observing(recorder):
      yield recorder
    recorder.save()
  finally:
    recorder.writer.discard()  # a no-op once saved


# --------------------------------------------------------------------------- replay


def place_like(recorded: recordings.Leaf, actual: Any) -> Any:
  """The recorded value as the kind of object `actual` is: a jax.Array on actual's
  sharding (a typed key array for a key leaf), numpy, or a Python scalar."""
  if recorded.kind == recordings.OPAQUE:
    return actual
  value = recorded.value
  if isinstance(actual, jax.Array):
    if recorded.kind == recordings.KEY_ARRAY:
      value = jax.random.wrap_key_data(value, impl=recorded.key_impl)
    if isinstance(actual.sharding, jax.sharding.SingleDeviceSharding):
      # Most likely an uncommitted array (a key split outside any pmap, say), which pmap
      # moves to its devices; a committed one on device 0 would be refused there.
      return jax.device_put(value)
    if actual.is_fully_addressable:
      return jax.device_put(value, actual.sharding)
    return jax.make_array_from_process_local_data(actual.sharding, np.asarray(value),
                                                  actual.shape)
  if isinstance(actual, np.ndarray):
    return np.array(value)
  if isinstance(actual, np.generic):
    return value[()]
  if isinstance(actual, (bool, int, float, complex)):
    return type(actual)(value.item())
  return value


# Argument kinds a site treats alike (pmap and jit take any of them as an array).
_ARRAYS = {recordings.JAX_ARRAY, recordings.NUMPY_ARRAY, recordings.NUMPY_SCALAR,
           "python.bool", "python.int", "python.float", "python.complex"}


def _as_recorded(leaves: list[recordings.Leaf],
                 recorded: list[recordings.Leaf]) -> list[recordings.Leaf]:
  """The program's arguments with array kinds named as recorded: numpy where the recording
  has a jax.Array (say, the global arrays of converted multi-host code) is the same input."""
  kinds = {leaf.path: leaf.kind for leaf in recorded}
  return [dataclasses.replace(leaf, kind=kinds[leaf.path])
          if leaf.kind in _ARRAYS and kinds.get(leaf.path) in _ARRAYS else leaf
          for leaf in leaves]


@dataclasses.dataclass
class CallResult:
  """One recorded call, replayed: its outputs against the recorded ones."""
  site: str
  index: int
  outputs: Report
  inputs: Report
  handed_back: bool  # the program got the recorded outputs
  loops: loop_records.LoopCheck | None = None  # its loops, stepped iteration by iteration
  note: str = ""

  @property
  def ok(self) -> bool:
    return (self.outputs.ok and not self.inputs.structure
            and (self.loops is None or self.loops.ok))

  def problem(self) -> str:
    """What is wrong with a call beyond tolerance: its arguments, then the loops inside it
    (which the outputs depend on), then the outputs."""
    loops = self.loops
    if self.inputs.structure:
      return ("the program called it with other arguments than recorded: "
              + self.inputs.structure[0])
    if loops is not None and not loops.ok:
      return "in its loops: " + (loops.structure[0] if loops.structure
                                 else loops.beyond[0].describe())
    return _first_problem(self.outputs)

  def only_bits_differ(self) -> bool:
    """Failing only because values are equal in other bits, where bit for bit is due."""
    loops, outputs = self.loops, self.outputs
    return (not self.ok and not self.inputs.structure
            and (outputs.ok or outputs.only_bits_differ)
            and (loops is None or loops.ok or loops.only_bits_differ))

  def line(self) -> str:
    loops = self.loops
    if not self.ok:
      verdict = "NOT BIT FOR BIT" if self.only_bits_differ() else "BEYOND TOLERANCE"
      text = f"{verdict}: " + self.problem()
    elif self.outputs.worst is None:
      text = "identical"
    else:
      worst = self.outputs.worst
      text = (f"within tolerance; worst leaf {trees.display_path(worst.path)} "
              f"{worst.dtype}{list(worst.shape or ())}: {worst.difference()}")
    lines = [f"    call {self.index}: {text}"]
    if loops is not None:
      lines.append(f"      {loops.summary()}; the outputs compared are the call's with "
                   "every iteration replayed")
      lines += [f"      loops: {problem}" for problem in loops.structure[1:]]
      if loops.worst is not None and loops.ok:
        lines.append(f"      worst iteration: {loops.worst.describe()}")
      if not loops.ok and not self.outputs.ok:
        lines.append("      outputs: " + _first_problem(self.outputs))
    if self.note:
      lines.append(f"      note: {self.note}")
    if not self.inputs.structure and not self.inputs.ok:
      lines.append("      note: the program's arguments differ from the recorded ones ("
                   + _first_problem(self.inputs) + "); the call ran on the recorded ones")
    if not self.handed_back:
      lines.append("      note: the outputs' structure differs, so the program kept this "
                   "run's outputs")
    return "\n".join(lines)


def _first_problem(report: Report) -> str:
  if report.structure:
    return report.structure[0]
  bad = report.failures[0]
  what = bad.difference() if bad.status in VALUE_STATUSES else bad.detail
  return f"leaf {trees.display_path(bad.path)} {bad.dtype}{list(bad.shape or ())}: {what}"


@dataclasses.dataclass
class Reached:
  """A site this run called, and what the recording has for it."""
  site: sites.Site
  entry: calls.SiteEntry | None
  calls: int = 0


class Replayer:
  """Checks every recorded call and hands back its recorded outputs (observer)."""

  def __init__(self, directory: str, *, rtol: float | None = None, atol: float | None = None,
               max_ulp: int | None = None, tolerance: Tolerance | None = None):
    self.directory = os.fspath(directory)
    recordings.require(self.directory)  # fail before a long run, not after it
    self._rtol, self._atol, self._max_ulp = rtol, atol, max_ulp
    self.stored: calls.Stored | None = None
    self.recorded_producer: dict = {}
    self.tolerance: Tolerance | None = tolerance  # given: used as it is (calibrate)
    self.reached: dict[str, Reached] = {}
    self.results: list[CallResult] = []
    self.stepped = SteppedSites()
    self.active = False

  def _load(self) -> calls.Stored:
    """Reads this process's recording on the first call (the job is set up by then)."""
    if self.stored is None:
      own = _process_directory(self.directory)
      self.stored = calls.read(own)
      self.recorded_producer = recordings.read_producer(own)
      if self.tolerance is None:
        self.tolerance = choose_tolerance(self.recorded_producer, recordings.jax_versions(),
                                          rtol=self._rtol, atol=self._atol,
                                          max_ulp=self._max_ulp,
                                          cross_version_max_ulp=PER_CALL_MAX_ULP)
    return self.stored

  def _match(self, site: sites.Site) -> calls.SiteEntry | None:
    stored = self._load()
    if site.key in stored.sites:
      return stored.sites[site.key]
    # A program imported under another module name (a converted tree's package, say):
    # the one recorded site of that qualified name nothing else claimed.
    taken = {r.entry.key for r in self.reached.values() if r.entry is not None}
    same = [e for e in stored.sites.values() if e.qualname == site.qualname and
            e.key not in taken and e.key.count("#") == site.key.count("#")]
    return same[0] if len(same) == 1 else None

  def call(self, caller: sites.SiteCaller, args: tuple, kwargs: dict) -> Any:
    site = caller.site
    if site.key not in self.reached:
      self.reached[site.key] = Reached(site, self._match(site))
    reached = self.reached[site.key]
    index = reached.calls
    reached.calls += 1
    if reached.entry is None or index >= reached.entry.recorded:
      return caller.implementation(*args, **kwargs)
    assert self.stored is not None and self.tolerance is not None
    recorded_in, recorded_out = self.stored.call(reached.entry, index)
    flat, treedef = jax.tree_util.tree_flatten((args, kwargs))
    structure, leaves = calls.host_leaves((args, kwargs))
    inputs = compare(recorded_in, recordings.Recording(structure, _as_recorded(
        leaves, recorded_in.leaves), {}), self.tolerance)
    rebound = (calls.keywords_by_position(recorded_in, caller)
               if inputs.structure and not kwargs else None)
    if rebound is not None:
      # Keyword arguments of the recorded call, which a plain-form site receives by
      # position: the same call.
      again = compare(rebound, recordings.Recording(structure, _as_recorded(
          leaves, rebound.leaves), {}), self.tolerance)
      if not again.structure:
        recorded_in, inputs = rebound, again
    if not inputs.structure and len(flat) == len(recorded_in.leaves):
      args, kwargs = jax.tree_util.tree_unflatten(
          treedef, [place_like(r, a) for r, a in zip(recorded_in.leaves, flat, strict=True)])
    # A call whose loops were recorded runs with them stepped: each iteration is checked
    # and starts from the recorded state, and the outputs are compared with those the
    # recorded run gave so (the loops' rounding cannot compound into them).
    stepped = self.stored.stepped(reached.entry, index)
    loops, note, out = None, "", None
    if stepped is not None:
      iterations, expected = stepped
      replayer = loop_records.IterationReplayer(iterations)
      out = self.stepped.run(caller, replayer, args, kwargs)
      if out is not None:
        loops = loop_records.check(iterations, replayer, self.tolerance)
      else:
        note = (f"the recording steps this call's loops, this run cannot: "
                f"{self.stepped.why_not[site.key]}; its outputs are compared whole")
    if out is None:
      expected = recorded_out
      out = jax.block_until_ready(caller.implementation(*args, **kwargs))
    structure, leaves = calls.host_leaves(out)
    outputs = compare(expected, recordings.Recording(structure, leaves, {}), self.tolerance,
                      site=reached.entry.key)
    out_flat, out_treedef = jax.tree_util.tree_flatten(out)
    handed_back = not outputs.structure and len(out_flat) == len(recorded_out.leaves)
    if handed_back:
      # What the program's own call returned when recorded, placed like this run's.
      back = compare(recorded_out, recordings.Recording(structure, leaves, {}), self.tolerance,
                     site=reached.entry.key)
      out = jax.tree_util.tree_unflatten(out_treedef, [
          a if verdict.status in ("identical", "mismatch") else place_like(r, a)
          for r, a, verdict in zip(recorded_out.leaves, out_flat, back.leaves, strict=True)])
    self.results.append(CallResult(reached.site.key, index, outputs, inputs, handed_back,
                                   loops, note))
    return out

  def report(self, final: Report | None = None) -> PerCallReport:
    stored = self._load()  # read here when no site was called
    assert self.tolerance is not None
    return PerCallReport(self.directory, stored, self.reached, self.results, self.tolerance,
                         self.recorded_producer, final)


@contextlib.contextmanager
def checking_calls(directory: str | os.PathLike, *, rtol: float | None = None,
                   atol: float | None = None, max_ulp: int | None = None,
                   tolerance: Tolerance | None = None) -> Iterator[Replayer]:
  """Checks each recorded call of every pmap site created in the block and replays it;
  `replayer.report()` after the block says how each call compared. `tolerance`, when
  given (one `calibrate` chose), replaces rtol / atol / max_ulp and the default."""
  replayer = Replayer(os.fspath(directory), rtol=rtol, atol=atol, max_ulp=max_ulp,
                      tolerance=tolerance)
  with sites.observing(replayer):
    yield replayer


# --------------------------------------------------------------------------- report


@dataclasses.dataclass
class PerCallReport:
  """Every replayed call's verdict, the sites only one run has, and the final outputs."""
  directory: str
  stored: calls.Stored
  reached: dict[str, Reached]
  results: list[CallResult]
  tolerance: Tolerance
  recorded: dict
  final: Report | None = None  # the end-to-end comparison of the replayed run's outputs

  @property
  def never_reached(self) -> list[calls.SiteEntry]:
    matched = {r.entry.key for r in self.reached.values() if r.entry is not None}
    return [e for e in self.stored.sites.values() if e.key not in matched]

  @property
  def never_recorded(self) -> list[Reached]:
    return [r for r in self.reached.values() if r.entry is None]

  @property
  def first_failure(self) -> CallResult | None:
    return next((r for r in self.results if not r.ok), None)

  @property
  def ok(self) -> bool:
    return (bool(self.results) and self.first_failure is None and not self.never_reached
            and not self.never_recorded)

  def worst_call(self) -> tuple[CallResult, LeafReport] | None:
    """The replayed call whose worst leaf differs most (ulp at leaf scale), if any differs."""
    differing = [(r, r.outputs.worst) for r in self.results if r.outputs.worst is not None]
    return max(differing, key=lambda rw: (rw[1].scale_ulp or 0.0, rw[1].max_abs or 0.0),
               default=None)

  def summary(self) -> str:
    identical = sum(r.ok and r.outputs.worst is None for r in self.results)
    within = sum(r.ok for r in self.results) - identical
    counts = (f"{len(self.reached)} sites reached, {len(self.results)} recorded calls "
              f"replayed: {identical} identical, {within} within tolerance")
    if self.ok:
      return f"PASS ({counts})"
    problems = []
    first = self.first_failure
    if first is not None:
      problems.append(f"{sum(not r.ok for r in self.results)} calls beyond tolerance, the "
                      f"first: {first.site} call {first.index}")
    if self.never_reached:
      problems.append(f"{len(self.never_reached)} recorded sites never reached")
    if self.never_recorded:
      problems.append(f"{len(self.never_recorded)} sites reached but never recorded")
    if not self.results and not problems:
      problems.append("no recorded call was replayed")
    return f"FAIL ({'; '.join(problems)}; {counts})"

  def __str__(self) -> str:
    rec = self.recorded
    running = self.final.running if self.final is not None else recordings.jax_versions()
    lines = [f"per-call check against {self.stored.directory}",
             f"recorded: jax {rec.get('jax')} ({rec.get('produced_by')}), "
             f"{rec.get('platform')} x{rec.get('device_count')}; the first "
             f"{self.stored.calls_per_site} calls of each pmap site",
             f"running:  jax {running.get('jax')} ({running.get('produced_by', '?')}), "
             f"{running.get('platform', '?')} x{running.get('device_count', '?')}",
             f"tolerance per call: {self.tolerance.describe()}"]
    by_site: dict[str, list[CallResult]] = {}
    for result in self.results:
      by_site.setdefault(result.site, []).append(result)
    for key, reached in self.reached.items():
      entry = reached.entry
      if entry is None:
        continue
      alias = "" if entry.key == key else f" (recorded as {entry.key})"
      lines.append(f"  site {key}{alias} ({reached.site.where}): called {reached.calls} times "
                   f"(recorded run: {entry.calls}, {entry.recorded} stored)")
      lines += [r.line() for r in by_site.get(key, [])]
    for entry in self.never_reached:
      lines.append(f"  recorded but never reached: site {entry.key} ({entry.where}), called "
                   f"{entry.calls} times in the recorded run")
    for reached in self.never_recorded:
      lines.append(f"  reached but never recorded: site {reached.site.key} "
                   f"({reached.site.where}), called {reached.calls} times")
    first = self.first_failure
    if first is not None:
      problem = first.problem()
      lines.append(f"first beyond tolerance: site {first.site}, call {first.index}, {problem}")
    worst_call = self.worst_call()
    if worst_call is None:
      lines.append("largest difference of a replayed call: none, every output is identical")
    else:
      result, leaf = worst_call
      lines.append(f"largest difference of a replayed call: {leaf.scale_ulp or 0.0:.3g} ulp at "
                   f"leaf scale (max ulp {leaf.max_ulp}), site {result.site} call "
                   f"{result.index}, leaf {trees.display_path(leaf.path)}")
    if self.final is not None:
      worst = self.final.worst
      lines.append("final outputs of the replayed run vs the recording (information: calls "
                   "after the stored ones run unreplayed): " + self.final.summary()
                   + (f"; worst leaf {trees.display_path(worst.path)}" if worst else ""))
    lines.append(self.summary())
    return "\n".join(lines)
