"""Compare an implementation under test against legacy ``jax.pmap``.

``compare_with_legacy(program, impl)`` runs ``program(jax.pmap)`` and
``program(impl)`` and asserts that they agree: the same pytree structure, and
leaf by leaf the same shape, dtype and values (bit-for-bit unless ``rtol`` /
``atol`` is given). When legacy raises, the implementation must raise an
exception of the same type. ``program`` receives the pmap to use, so one
program can nest pmaps, wrap them in ``jax.grad`` and so on. Off jax 0.6.0,
legacy's recorded outcome is a reference (support/legacy_recordings.py), and legacy
in-process too where the release still has it.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable

import jax
import numpy as np

from support import legacy_recordings
from support.jax_lines import on_legacy_line
from support.legacy_pmap import has_legacy_pmap, legacy_reference

PmapLike = Callable[..., Callable[..., Any]]


class Outcome:
  """What a program produced: a value or an exception."""

  def __init__(self, value: Any = None, error: BaseException | None = None):
    self.value = value
    self.error = error

  def __repr__(self) -> str:
    return f"Outcome(error={self.error!r})" if self.error else f"Outcome(value={self.value!r})"


def run_program(program: Callable[[PmapLike], Any], pmap: PmapLike) -> Outcome:
  """Runs ``program(pmap)`` and waits for its device work, so asynchronous errors surface here."""
  try:
    value = program(pmap)
    value = jax.block_until_ready(value)
  except Exception as e:  # pylint: disable=broad-except
    return Outcome(error=e)
  return Outcome(value=value)


def _is_key(x: Any) -> bool:
  return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _describe(path: tuple) -> str:
  return jax.tree_util.keystr(path) or "<root>"


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
  """Bit for bit: NaN payloads and the signs of zeros too (one release, one answer)."""
  return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def _value_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """Elementwise: equal as numbers (a NaN equals any NaN, -0.0 equals 0.0, an infinity only
  itself); values that are not floating: equal."""
  if not jax.dtypes.issubdtype(a.dtype, np.inexact):  # bfloat16 and float8 are inexact too
    return np.asarray(a == b)
  equal = np.ones(a.shape, bool)
  parts = ((a.real, b.real), (a.imag, b.imag)) if a.dtype.kind == "c" else ((a, b),)
  for x, y in ((x.astype(np.float64), y.astype(np.float64)) for x, y in parts):
    equal &= (x == y) | (np.isnan(x) & np.isnan(y))
  return equal


def _bits_message(where: str, e: np.ndarray, a: np.ndarray) -> str:
  """Why two arrays are not bit for bit: the first element whose value, else whose bits, differ."""
  equal = _value_equal(e, a)
  if not equal.all():
    diff = np.argwhere(~equal)
    first = tuple(int(i) for i in diff[0])
    return (f"at {where}: values differ from legacy in {len(diff)} of {e.size} elements; "
            f"first at index {first}: legacy {e[first]!r} vs {a[first]!r}")
  bits = lambda x: np.ascontiguousarray(x).reshape(x.size, -1).view(np.uint8)  # noqa: E731
  differ = np.flatnonzero((bits(e) != bits(a)).any(axis=-1))
  first = tuple(int(i) for i in np.unravel_index(int(differ[0]), e.shape))
  return (f"at {where}: value-equal, bits differ (a NaN payload or a zero's sign) in "
          f"{len(differ)} of {e.size} elements; first at index {first}: legacy bits "
          f"{_hex(e[first])} vs {_hex(a[first])}")


def _hex(x: Any) -> str:
  """An element's bits, as the integer of its width (bytes beyond 8: in memory order)."""
  x = np.asarray(x)
  if x.dtype.itemsize in (1, 2, 4, 8):
    return f"0x{int(x.view(np.dtype(f'uint{8 * x.dtype.itemsize}'))):0{2 * x.dtype.itemsize}x}"
  return x.tobytes().hex()


def assert_leaf_equal(expected: Any, actual: Any, *, where: str = "<root>",
                      rtol: float | None = None, atol: float | None = None) -> None:
  """Asserts two leaves match in kind, shape, dtype and value."""
  e_arr, a_arr = hasattr(expected, "shape"), hasattr(actual, "shape")
  if not (e_arr and a_arr):
    assert type(expected) is type(actual) and expected == actual, (
        f"at {where}: expected {expected!r}, got {actual!r}")
    return
  assert expected.shape == actual.shape, (
      f"at {where}: shape {actual.shape} differs from legacy's {expected.shape}")
  assert expected.dtype == actual.dtype, (
      f"at {where}: dtype {actual.dtype} differs from legacy's {expected.dtype}")
  if _is_key(expected):
    expected, actual = jax.random.key_data(expected), jax.random.key_data(actual)
  if expected.dtype == jax.dtypes.float0:
    return  # float0 carries no values
  e, a = np.asarray(expected), np.asarray(actual)
  if rtol is None and atol is None:
    if not _bits_equal(e, a):
      raise AssertionError(_bits_message(where, e, a))
  else:
    np.testing.assert_allclose(a, e, rtol=rtol or 0, atol=atol or 0,
                               err_msg=f"at {where}: values differ from legacy")


def assert_trees_equal(expected: Any, actual: Any, *, rtol: float | None = None,
                       atol: float | None = None) -> None:
  """Asserts equal tree structure and equal leaves (see ``assert_leaf_equal``)."""
  e_struct, a_struct = jax.tree.structure(expected), jax.tree.structure(actual)
  assert e_struct == a_struct, (
      f"output tree structure {a_struct} differs from legacy's {e_struct}")
  e_leaves = jax.tree_util.tree_flatten_with_path(expected)[0]
  a_leaves = jax.tree.leaves(actual)
  for (path, e), a in zip(e_leaves, a_leaves, strict=True):
    assert_leaf_equal(e, a, where=_describe(path), rtol=rtol, atol=atol)


def _compare_outcomes(reference: Outcome, ours: Outcome, name: str, rtol: float | None,
                      atol: float | None) -> None:
  """The implementation must do what the reference `name` did in this process."""
  if reference.error is not None:
    if ours.error is None:
      raise AssertionError(
          f"{name} raised {type(reference.error).__name__}: {reference.error}; "
          f"the implementation under test returned {ours.value!r}")
    if not isinstance(ours.error, type(reference.error)):
      raise AssertionError(
          f"{name} raised {type(reference.error).__name__}: {reference.error}; "
          f"the implementation under test raised {type(ours.error).__name__}: {ours.error}"
      ) from ours.error
    return
  if ours.error is not None:
    raise AssertionError(
        f"the implementation under test raised {type(ours.error).__name__}: {ours.error}; "
        f"{name} returned normally") from ours.error
  assert_trees_equal(reference.value, ours.value, rtol=rtol, atol=atol)


def compare_with_legacy(program: Callable[[PmapLike], Any], impl: PmapLike, *,
                        rtol: float | None = None, atol: float | None = None) -> Outcome:
  """Runs ``program`` under legacy ``jax.pmap`` and under ``impl`` and asserts they agree.

  On jax 0.6.0 legacy runs in-process, and its outcome must also match the case's
  recording (support/legacy_recordings.py; written instead with RECORD_LEGACY=1). On
  other JAX releases the recording is a reference (within the cross-version bound), and
  where the release still has legacy pmap (through 0.9.x, support/legacy_pmap.py) legacy
  also runs in-process and its values must be matched bit for bit wherever it returns
  as the recording did. Returns legacy's outcome so a test can make further assertions; off
  0.6.0 that is the recorded exception, rebuilt (so its message is 0.6.0 legacy's, the
  wording pmap_compat keeps on every release), or the implementation's value, which
  matched the recording.
  """
  test = legacy_recordings.running_test()
  case = legacy_recordings.next_case(test) if test else None
  if not on_legacy_line():
    ours = run_program(program, impl)
    if case is None:
      raise RuntimeError("compare_with_legacy off jax 0.6.0 needs a recorded legacy result, "
                         "and those exist for pytest tests only")
    error = legacy_recordings.reference(case, ours.value, ours.error, rtol=rtol, atol=atol)
    if has_legacy_pmap() and error is None:
      legacy = run_program(program, legacy_reference())
      # Where this release's legacy returns too, its values are the bit-for-bit reference.
      # Where it raises (its surface changed: no `.trace` on 0.7), 0.6.0's recorded
      # behaviour, which pmap_compat keeps on every release, is the spec; so is the
      # recorded error's type wherever legacy raised on 0.6.0.
      if legacy.error is None:
        _compare_outcomes(legacy, ours, "legacy jax.pmap", rtol, atol)
    return Outcome(error=error) if error is not None else ours
  legacy = run_program(program, jax.pmap)
  ours = run_program(program, impl)
  if case is not None:
    if legacy_recordings.writing():
      legacy_recordings.write(case, legacy.value, legacy.error)
    else:
      legacy_recordings.check_fresh(case, legacy.value, legacy.error)
  _compare_outcomes(legacy, ours, "legacy jax.pmap", rtol, atol)
  return legacy


def compare_with_jax_pmap(program: Callable[[PmapLike], Any], impl: PmapLike, *,
                          rtol: float | None = None, atol: float | None = None) -> Outcome:
  """Off jax 0.6.0: runs ``program`` under JAX's own ``jax.pmap`` (jit + shard_map) and
  under ``impl``. Where JAX's pmap returns normally, ``impl`` must return the same, bit
  for bit unless ``rtol`` / ``atol`` is given (both run on one XLA). Where it raises
  (nested pmaps, input kinds legacy accepted) nothing is asserted: compare_with_legacy's
  recordings cover those. Returns JAX's outcome.
  """
  if on_legacy_line():
    raise RuntimeError("on jax 0.6.0 jax.pmap is legacy's own: use compare_with_legacy")
  reference = run_program(program, jax.pmap)
  ours = run_program(program, impl)
  if reference.error is None:
    _compare_outcomes(reference, ours, "JAX's jax.pmap", rtol, atol)
  return reference


def compare_call(fun: Callable, args: tuple, impl: PmapLike, *, kwargs: dict | None = None,
                 rtol: float | None = None, atol: float | None = None,
                 **pmap_kwargs: Any) -> Outcome:
  """``compare_with_legacy`` for the common case ``pmap(fun, **pmap_kwargs)(*args, **kwargs)``."""
  call_kwargs = kwargs or {}
  return compare_with_legacy(lambda pmap: pmap(fun, **pmap_kwargs)(*args, **call_kwargs),
                             impl, rtol=rtol, atol=atol)
