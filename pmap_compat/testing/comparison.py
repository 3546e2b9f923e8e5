"""Leaf-by-leaf comparison of a recording with a new run, and the report it produces.

Per leaf the verdict is one of
  identical   same kind, dtype, shape and bits
  value-equal every element equal as a number, some in other bits: a NaN with another
              payload, a zero with the other sign ("value-equal, bits differ"); within
              any tolerance but bit for bit
  bits-differ the same, where the tolerance is bit for bit: it fails, named as such
  within      values differ, every element within the tolerance
  beyond      some element beyond the tolerance
  mismatch    the leaf's kind, dtype or shape (or key implementation) differs
  missing     recorded, but the new run has no leaf at this path
  unexpected  the new run has a leaf at a path the recording does not
Floating-point differences are measured in ulp (units in the last place: how many
representable values lie between the two), absolute and relative (to the recorded
value). An element is within tolerance when
  - its ulp distance from the recorded value is at most `max_ulp`, or
  - its difference is at most `max_ulp` ulp of the leaf's largest recorded magnitude
    ("ulp at leaf scale": rounding in a sum or product is relative to its operands,
    so a value that cancels toward zero may move many of its own ulp), or
  - |actual - recorded| <= atol + rtol * |recorded|.
Identical non-finite values are equal at every scale; one that does not match (NaN
against a number, an infinity against anything but itself) is beyond any tolerance, and
the scales are the largest finite magnitudes, so an infinity hides no finite difference.
`max_ulp` applies to floating leaves only: integer and bool leaves differ only under
atol/rtol; PRNG keys and strings never. A float64 leaf whose recorded values are all
float32 values (a python float taken from a float32 array, as `float(loss)` gives) is
measured in float32 ulp: its last float32 bit is the precision it ever had.
"""
from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Mapping, Sequence

import numpy as np

from pmap_compat.testing import recordings, trees

# Default bound when the recording comes from another jax/jaxlib version (XLA changes
# between releases reorder reductions and fuse differently). Measured on the shipped
# examples, jax 0.10.2 (its own jax.pmap, and the codemod output) against legacy
# jax.pmap on jax 0.6.0: at most 7 ulp at leaf scale (replicate_loop's velocity after
# six steps; elementwise up to 34 ulp, in values near zero). About twice that leaves
# room for loops that compound the differences; a real change (a perturbed program)
# moves values by orders of magnitude more.
CROSS_VERSION_MAX_ULP = 16

# Statuses of a leaf whose elements all equal the recorded ones as numbers, some in other
# bits: ok unless the tolerance is bit for bit.
VALUE_EQUAL = "value-equal"
BITS_DIFFER = "bits-differ"
# Statuses whose LeafReport carries the difference statistics.
VALUE_STATUSES = ("within", "beyond", VALUE_EQUAL, BITS_DIFFER)
_VERDICTS = {"within": "within tolerance", "beyond": "BEYOND TOLERANCE",
             VALUE_EQUAL: "within tolerance", BITS_DIFFER: "NOT BIT FOR BIT"}


@dataclasses.dataclass(frozen=True)
class Tolerance:
  """How far a new run may be from the recording. `exact`: bit for bit."""
  exact: bool
  max_ulp: int = 0
  rtol: float = 0.0
  atol: float = 0.0
  why: str = ""
  # Calibrated: (site, output leaf path) -> its own max_ulp; the other output leaves of a
  # call get `leaf_default` (inputs and loop values keep `max_ulp`). See calibrate.
  leaves: Mapping[tuple[str, str], int] | None = None
  leaf_default: int = 0

  def for_leaf(self, site: str | None, path: str) -> Tolerance:
    """The tolerance an output leaf of a call of `site` is checked with."""
    if self.leaves is None or site is None:
      return self
    own = self.leaves.get((site, trees.display_path(path)), self.leaf_default)
    return dataclasses.replace(self, max_ulp=own, leaves=None)

  def describe(self) -> str:
    if self.exact:
      return f"bit for bit ({self.why})" if self.why else "bit for bit"
    parts = [f"max {self.max_ulp} ulp (elementwise or at leaf scale)"]
    parts += [f"atol {self.atol:g}"] if self.atol else []
    parts += [f"rtol {self.rtol:g}"] if self.rtol else []
    why = self.why
    if self.leaves is not None:
      why += (f"; each output leaf within twice JAX's own ulp on it, at least "
              f"{self.leaf_default}")
    return " or ".join(parts) + (f" ({why})" if why else "")


def choose_tolerance(recorded: dict, running: dict, *, rtol: float | None = None,
                     atol: float | None = None, max_ulp: int | None = None,
                     cross_version_max_ulp: int = CROSS_VERSION_MAX_ULP) -> Tolerance:
  """The given tolerance; else bit for bit on the same jax/jaxlib, else the cross-version
  bound (`cross_version_max_ulp`)."""
  for name, value in (("rtol", rtol), ("atol", atol), ("max_ulp", max_ulp)):
    if value is not None and (not isinstance(value, (int, float)) or value < 0):
      raise ValueError(f"{name} must be a non-negative number, got {value!r}")
  if max_ulp is not None and int(max_ulp) != max_ulp:
    raise ValueError(f"max_ulp must be a whole number of ulp, got {max_ulp!r}")
  if rtol is not None or atol is not None or max_ulp is not None:
    return Tolerance(False, int(max_ulp or 0), float(rtol or 0.0), float(atol or 0.0), "given")
  versions = lambda p: (p.get("jax"), p.get("jaxlib"))  # noqa: E731
  if versions(recorded) == versions(running):
    return Tolerance(True, why=f"same jax {running.get('jax')} as the recording")
  return Tolerance(False, cross_version_max_ulp,
                   why=f"default across versions: recorded on jax {recorded.get('jax')}, "
                   f"running jax {running.get('jax')}")


@dataclasses.dataclass
class LeafReport:
  """The verdict for one leaf (see the module docstring for `status`)."""
  path: str
  shape: tuple[int, ...] | None
  dtype: str | None
  status: str
  detail: str = ""
  max_ulp: int | None = None
  max_abs: float | None = None
  max_rel: float | None = None
  scale_ulp: float | None = None  # max abs difference in ulp of the leaf's largest magnitude
  differing: int = 0
  size: int = 0

  @property
  def ok(self) -> bool:
    return self.status in ("identical", "within", VALUE_EQUAL)

  def line(self, path_width: int = 0) -> str:
    kind = f"{self.dtype}{list(self.shape)}" if self.shape is not None else str(self.dtype)
    text = f"{trees.display_path(self.path):<{path_width}}  {kind:<18}  "
    if self.status == "identical":
      return text + "identical"
    if self.status in (VALUE_EQUAL, BITS_DIFFER):  # difference() holds the detail
      return text + f"{self.difference()}  {_VERDICTS[self.status]}"
    if self.status in VALUE_STATUSES:
      return (text + f"{self.difference()}  {_VERDICTS[self.status]}"
              + (f" ({self.detail})" if self.detail else ""))
    return text + f"{self.status.upper()}: {self.detail}"

  def difference(self) -> str:
    if self.status in (VALUE_EQUAL, BITS_DIFFER):
      return f"{self.differing} of {self.size} elements value-equal, bits differ ({self.detail})"
    parts = [f"{self.differing} of {self.size} elements differ"]
    if self.max_ulp is not None:
      parts.append(f"max ulp {self.max_ulp} ({self.scale_ulp:.3g} at leaf scale)")
    if self.max_abs is not None:
      parts.append(f"max abs {self.max_abs:.3g}")
    if self.max_rel is not None:
      parts.append(f"max rel {self.max_rel:.3g}")
    return ", ".join(parts)


@dataclasses.dataclass
class Report:
  """The outcome of checking a run against a recording; `str(report)` is the full text."""
  leaves: list[LeafReport]
  structure: list[str]  # tree-structure differences, one line each
  tolerance: Tolerance
  recorded: dict
  running: dict
  label: str = ""

  @property
  def ok(self) -> bool:
    return not self.structure and all(leaf.ok for leaf in self.leaves)

  @property
  def failures(self) -> list[LeafReport]:
    return [leaf for leaf in self.leaves if not leaf.ok]

  @property
  def only_bits_differ(self) -> bool:
    """Failing only because some values are equal in other bits, where bit for bit is due."""
    failures = self.failures
    return (not self.structure and bool(failures)
            and all(leaf.status == BITS_DIFFER for leaf in failures))

  @property
  def worst(self) -> LeafReport | None:
    """The first failing leaf, else the one with the largest ulp (then abs) difference."""
    if self.failures:
      return self.failures[0]
    differing = [leaf for leaf in self.leaves if leaf.status in ("within", VALUE_EQUAL)]
    if not differing:
      return None
    return max(differing, key=lambda l: (l.max_ulp or 0, l.max_abs or 0.0))

  def summary(self) -> str:
    identical = sum(leaf.status == "identical" for leaf in self.leaves)
    within = sum(leaf.status == "within" for leaf in self.leaves)
    equal = sum(leaf.status == VALUE_EQUAL for leaf in self.leaves)
    counts = (f"{len(self.leaves)} leaves: {identical} identical, "
              + (f"{equal} value-equal (bits differ), " if equal else "")
              + f"{within} within tolerance")
    if self.ok:
      return f"PASS ({counts})"
    bad = [trees.display_path(l.path) for l in self.failures]
    problems = ([f"tree structure differs ({len(self.structure)} place(s))"]
                if self.structure else []) + (
                    [f"{len(bad)} leaves fail: {', '.join(bad[:5])}"
                     + (" ..." if len(bad) > 5 else "")] if bad else [])
    return f"FAIL ({'; '.join(problems)}; {counts})"

  def notes(self) -> list[str]:
    """Known causes of differences, when the recording and this run disagree on them."""
    notes = []
    was, now = (p.get("device_count") for p in (self.recorded, self.running))
    if None not in (was, now) and was != now:
      notes.append(f"note: recorded with {was} devices, this run has {now} (on CPU, set "
                   f"XLA_FLAGS=--xla_force_host_platform_device_count={was})")
    was, now = (p.get("threefry_partitionable") for p in (self.recorded, self.running))
    if None not in (was, now) and was != now:
      notes.append(f"note: jax_threefry_partitionable was {was} when recorded and is {now} "
                   "now, so random numbers differ (jax 0.5.0 changed its default); run with "
                   f"JAX_THREEFRY_PARTITIONABLE={int(bool(was))} to draw the recorded ones "
                   "(jax 0.6.0 reproduces jax 0.4's draws that way, jax 0.10.2 does not: there, "
                   "record on jax < 0.5 with JAX_THREEFRY_PARTITIONABLE=1)")
    return notes

  def __str__(self) -> str:
    rec, run = self.recorded, self.running
    lines = ([self.label] if self.label else []) + [
        f"recorded: jax {rec.get('jax')} ({rec.get('produced_by')}), "
        f"{rec.get('platform')} x{rec.get('device_count')}",
        f"running:  jax {run.get('jax')} ({run.get('produced_by')}), "
        f"{run.get('platform')} x{run.get('device_count')}",
        f"tolerance: {self.tolerance.describe()}"]
    lines += self.notes() + self.structure
    width = max([len(trees.display_path(l.path)) for l in self.leaves] + [0])
    lines += ["  " + leaf.line(width) for leaf in self.leaves]
    worst = self.worst
    if worst is None:
      lines.append("worst leaf: none, every leaf is identical")
    else:
      how = worst.difference() if worst.status in VALUE_STATUSES else worst.detail
      lines.append(f"worst leaf: {trees.display_path(worst.path)} ({how})")
    lines.append(self.summary())
    return "\n".join(lines)


# --------------------------------------------------------------------------- values


def _ordered_ints(x: np.ndarray) -> np.ndarray:
  """Maps floats to integers whose difference counts the representable values between them."""
  bits = x.view(np.dtype(f"int{8 * x.dtype.itemsize}"))
  if x.dtype.itemsize < 8:
    wide = bits.astype(np.int64)
    return np.where(wide < 0, np.int64(-(2 ** (8 * x.dtype.itemsize - 1))) - wide, wide)
  return np.where(bits < 0, np.iinfo(np.int64).min - bits, bits)


def ulp_distance(expected: np.ndarray, actual: np.ndarray) -> np.ndarray:
  """Elementwise ulp distance of two real float arrays of one dtype, as uint64 (NaN: undefined)."""
  a, b = _ordered_ints(expected), _ordered_ints(actual)
  au, bu = a.view(np.uint64), b.view(np.uint64)
  return np.where(a >= b, au - bu, bu - au)


def _is_float(dtype: np.dtype) -> bool:
  return np.issubdtype(dtype, np.inexact) or (dtype.kind == "V" and _is_ml_float(dtype))


def _is_ml_float(dtype: np.dtype) -> bool:
  """bfloat16, float8_* and other ml_dtypes floats (numpy sees them as void)."""
  import ml_dtypes  # pylint: disable=import-outside-toplevel
  try:
    ml_dtypes.finfo(dtype)
  except (ValueError, TypeError):
    return False
  return True


def _real_parts(x: np.ndarray) -> list[np.ndarray]:
  return [np.ascontiguousarray(x.real), np.ascontiguousarray(x.imag)] if np.iscomplexobj(x) \
      else [x]


def _isnan(x: np.ndarray) -> np.ndarray:
  if not _is_float(x.dtype):
    return np.zeros(x.shape, bool)
  if np.iscomplexobj(x):
    return np.isnan(x.real) | np.isnan(x.imag)
  return np.isnan(x.astype(np.float64))


def _bits_equal(expected: np.ndarray, actual: np.ndarray) -> np.ndarray:
  """Elementwise: the same bits (NaN payloads and the signs of zeros too)."""
  if np.iscomplexobj(expected):
    real, imag = (_bits_equal(e, a) for e, a in
                  zip(_real_parts(expected), _real_parts(actual), strict=True))
    return real & imag
  bits = np.dtype(f"uint{8 * expected.dtype.itemsize}")
  return expected.view(bits) == actual.view(bits)


def _value_equal(expected: np.ndarray, actual: np.ndarray) -> np.ndarray:
  """Elementwise: equal as numbers, where any NaN equals any NaN and -0.0 equals 0.0 (and
  an infinity only itself); values that are not floating: the same bits."""
  if not _is_float(expected.dtype):
    return _bits_equal(expected, actual)
  equal = np.ones(expected.shape, bool)
  for e, a in zip(_real_parts(expected), _real_parts(actual), strict=True):
    e64, a64 = e.astype(np.float64), a.astype(np.float64)
    equal &= (e64 == a64) | (np.isnan(e64) & np.isnan(a64))
  return equal


def _plural(n: int, one: str, many: str) -> str:
  return f"{n} {one if n == 1 else many}"


def _bits_only(expected: np.ndarray, mask: np.ndarray) -> str:
  """What differs in the bits of the value-equal elements `mask`: NaN payloads, zero signs."""
  nans = int((mask & _isnan(expected)).sum())
  zeros = int(mask.sum()) - nans
  return ", ".join(([_plural(nans, "NaN payload", "NaN payloads")] if nans else [])
                   + ([_plural(zeros, "sign of zero", "signs of zero")] if zeros else []))


def _unmatched(expected: np.ndarray, actual: np.ndarray, mask: np.ndarray) -> list[str]:
  """The non-finite values of `mask` that match nothing, said as numbers cannot be."""
  notes = []
  nan_once = mask & (_isnan(expected) != _isnan(actual))
  if nan_once.any():
    notes.append(_plural(int(nan_once.sum()), "element is", "elements are")
                 + " NaN in one run only")
  infinite = mask & ~nan_once
  if infinite.any():
    first = tuple(int(i) for i in np.argwhere(infinite)[0])
    notes.append(_plural(int(infinite.sum()), "element differs", "elements differ")
                 + f" in an infinity, the first at {first}: recorded {expected[first]}, "
                 f"got {actual[first]}")
  return notes


def _in_float32_if_exact(expected: np.ndarray, actual: np.ndarray) -> tuple[np.ndarray, ...]:
  """float64 values that are all float32 values carry float32 precision: measure them so."""
  narrow = {np.dtype(np.float64): np.float32, np.dtype(np.complex128): np.complex64}.get(
      expected.dtype)
  if narrow is None:
    return expected, actual
  with np.errstate(over="ignore"):
    as_narrow: np.ndarray = expected.astype(narrow)
  finite = np.isfinite(expected)
  if not np.array_equal(as_narrow[finite], expected[finite]):
    return expected, actual
  with np.errstate(over="ignore"):
    return as_narrow, actual.astype(narrow)


def scale_ulp(values: Sequence[np.ndarray], dtype: np.dtype) -> float:
  """One ulp of `dtype` at the largest finite magnitude among the floating `values` (the
  smallest subnormal if all are 0): "ulp at leaf scale" for one leaf, "ulp at part scale"
  for the values of one loop iteration (loop_records)."""
  import ml_dtypes  # pylint: disable=import-outside-toplevel
  dtype = np.dtype(dtype)
  info = ml_dtypes.finfo(np.finfo(dtype).dtype if np.issubdtype(dtype, np.complexfloating)
                         else dtype)
  largest = 0.0
  for x in values:
    if _is_float(x.dtype) and x.size:
      magnitudes = np.concatenate([np.abs(p.astype(np.float64)).ravel()
                                   for p in _real_parts(x)])
      largest = max(largest, float(magnitudes[np.isfinite(magnitudes)].max(initial=0.0)))
  if largest < float(info.tiny):
    return float(info.smallest_subnormal)
  return float(info.eps) * 2.0 ** np.floor(np.log2(largest))


def compare_values(expected: np.ndarray, actual: np.ndarray, tol: Tolerance,
                   together: Sequence[np.ndarray] = ()) -> dict:
  """Status and difference statistics for two arrays of one dtype and shape. "ulp at scale"
  (`scale_ulp`) is measured at the largest finite magnitude of `expected`, or of the
  recorded values computed `together` with it where larger (loop_records: part scale)."""
  expected = np.ascontiguousarray(expected)
  actual = np.ascontiguousarray(actual)
  if expected.size == 0 or expected.dtype.itemsize == 0:  # float0 carries no values
    return {"status": "identical"}
  same = _bits_equal(expected, actual)
  if same.all():
    return {"status": "identical"}
  equal = _value_equal(expected, actual)
  stats: dict[str, Any] = {"differing": int((~same).sum()), "size": int(expected.size)}
  bits_only = equal & ~same
  if equal.all():  # a NaN payload or a zero's sign: no number differs, the bits do
    stats["detail"] = _bits_only(expected, bits_only)
    stats["status"] = BITS_DIFFER if tol.exact else VALUE_EQUAL
    return stats
  notes = ([f"{int(bits_only.sum())} of those value-equal, bits differ: "
            f"{_bits_only(expected, bits_only)}"] if bits_only.any() else [])
  wide = np.complex128 if np.iscomplexobj(expected) else np.float64
  e64, a64 = expected.astype(wide), actual.astype(wide)
  # Non-finite values that are not equal (NaN against a number, an infinity against
  # anything but itself) have no ulp or scale to be within: beyond any tolerance.
  unmatched = ~equal & ~(np.isfinite(e64) & np.isfinite(a64))
  notes += _unmatched(expected, actual, unmatched)
  with np.errstate(invalid="ignore", over="ignore"):
    abs_diff = np.abs(a64 - e64)
  abs_diff = np.where(equal, 0.0, np.where(unmatched, np.inf, abs_diff))
  with np.errstate(divide="ignore", invalid="ignore"):
    rel = np.where(unmatched, np.inf, np.where(abs_diff == 0, 0.0, abs_diff / np.abs(e64)))
  stats["max_abs"], stats["max_rel"] = float(abs_diff.max()), float(rel.max())
  with np.errstate(invalid="ignore"):  # rtol 0 times an infinity
    within = equal | (abs_diff <= tol.atol + tol.rtol * np.abs(e64))
  if _is_float(expected.dtype):
    expected, actual = _in_float32_if_exact(expected, actual)
    ulps = np.zeros(expected.shape, np.uint64)
    for e, a in zip(_real_parts(expected), _real_parts(actual), strict=True):
      ulps = np.maximum(ulps, ulp_distance(e, a))
    ulps = np.where(equal | unmatched, np.uint64(0), ulps)
    stats["max_ulp"] = int(ulps.max())
    finite = np.where(unmatched, 0.0, abs_diff)
    one = scale_ulp([expected, *together], expected.dtype)
    stats["scale_ulp"] = float(finite.max() / one)
    within |= (ulps <= np.uint64(tol.max_ulp)) | (finite <= tol.max_ulp * one)
  within &= ~unmatched
  if notes:
    stats["detail"] = "; ".join(notes)
  stats["status"] = "within" if not tol.exact and within.all() else "beyond"
  return stats


# --------------------------------------------------------------------------- leaves


def compare_leaf(recorded: recordings.Leaf, actual: recordings.Leaf, tol: Tolerance) -> LeafReport:
  report = LeafReport(recorded.path, recorded.shape, recorded.dtype, "mismatch")
  if recorded.kind != actual.kind:
    report.detail = f"type differs: recorded {recorded.kind}, got {actual.kind}"
  elif recorded.dtype != actual.dtype:
    report.detail = f"dtype differs: recorded {recorded.dtype}, got {actual.dtype}"
  elif tuple(recorded.shape) != tuple(actual.shape):
    report.detail = (f"shape differs: recorded {tuple(recorded.shape)}, "
                     f"got {tuple(actual.shape)}")
  elif recorded.key_impl != actual.key_impl:
    report.detail = (f"PRNG key implementation differs: recorded {recorded.key_impl}, "
                     f"got {actual.key_impl}")
  elif recorded.kind in recordings.INLINE_KINDS:
    if recorded.value == actual.value:
      report.status = "identical"
    else:
      report.detail = f"value differs: recorded {recorded.value!r}, got {actual.value!r}"
  else:
    exact_only = recorded.kind == recordings.KEY_ARRAY  # key bits are identities, not numbers
    stats = compare_values(recorded.value, actual.value,
                           Tolerance(True) if exact_only else tol)
    for name, value in stats.items():
      setattr(report, name, value)
  return report


def compare(recorded: recordings.Recording, actual: recordings.Recording, tol: Tolerance,
            label: str = "", site: str | None = None) -> Report:
  """Compares every leaf of `actual` with `recorded` (matched by path); `site`: these are
  the outputs of a call of that site (a calibrated tolerance bounds each leaf by its own)."""
  structure = trees.differences(recorded.tree, actual.tree)
  got = {leaf.path: leaf for leaf in actual.leaves}
  leaves = []
  for leaf in recorded.leaves:
    if leaf.path in got:
      leaves.append(compare_leaf(leaf, got.pop(leaf.path), tol.for_leaf(site, leaf.path)))
    else:
      leaves.append(LeafReport(leaf.path, leaf.shape, leaf.dtype, "missing",
                               "recorded, but not in this run's outputs"))
  leaves += [LeafReport(l.path, l.shape, l.dtype, "unexpected", "not in the recording")
             for l in got.values()]
  return Report(leaves, structure, tol, recorded.producer, actual.producer, label)
