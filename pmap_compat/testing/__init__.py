"""Record what a program computes on the JAX you run today; check it anywhere later.

For migrations off `jax.pmap`: `record` stores a program's outputs (and each pmap site's
first calls), `check` runs it again (under `pmap_compat.patched()`, as converted code, or on
another JAX) and compares, leaf by leaf, call by call and loop iteration by loop iteration.
Uses only public JAX and numpy, so it also imports where the rest of `pmap_compat` does not.
The command line (`python -m pmap_compat.testing`), tolerances, the recording format and this
library's API: docs/testing.md.
"""
from __future__ import annotations

import os
from typing import Any
from collections.abc import Callable

import jax

from pmap_compat.testing import programs, recordings
from pmap_compat.testing.comparison import (CROSS_VERSION_MAX_ULP, LeafReport, Report, Tolerance,
                                            choose_tolerance, compare)
from pmap_compat.testing.per_call import (PER_CALL_MAX_ULP, PerCallReport, checking_calls,
                                          recording_calls)
from pmap_compat.testing.recordings import Leaf, Recording

__all__ = [
    "record", "load", "check", "assert_matches_recording", "compare_recordings", "Recording",
    "Leaf", "Report", "LeafReport", "Tolerance", "CROSS_VERSION_MAX_ULP", "PER_CALL_MAX_ULP",
    "PerCallReport", "recording_calls", "checking_calls",
]


def _outputs_and_producer(fn_or_outputs: Any, kwargs: dict | None) -> tuple[Any, dict]:
  if callable(fn_or_outputs):
    source = programs.source_file(fn_or_outputs)
    outputs = programs.run(fn_or_outputs, dict(kwargs or {}))
    return outputs, recordings.producer_info(
        source, getattr(fn_or_outputs, "__qualname__", None), kwargs, programs.uses_pmap(source))
  if kwargs:
    raise TypeError("kwargs are for a function to call; record() got outputs, not a function")
  return jax.block_until_ready(fn_or_outputs), recordings.producer_info(None, None, None, None)


def _own_directory(directory: str | os.PathLike) -> str:
  """This process's part of a recording (DIR/process_<i> in a multi-process job)."""
  return recordings.process_directory(os.fspath(directory), jax.process_index(),
                                      jax.process_count())


def record(fn_or_outputs: Any, directory: str | os.PathLike, *, kwargs: dict | None = None,
           metadata: dict | None = None) -> Recording:
  """Records `fn(**kwargs)`'s outputs (or the outputs given) into `directory`.

  `metadata` (JSON-able) is stored alongside, e.g. which mode or commit produced it.
  """
  outputs, producer = _outputs_and_producer(fn_or_outputs, kwargs)
  return recordings.write(_own_directory(directory), outputs, producer, metadata)


def load(directory: str | os.PathLike) -> Recording:
  """Reads a recording (this process's part, in a multi-process job)."""
  return recordings.read(_own_directory(directory))


def check(fn_or_outputs: Any, directory: str | os.PathLike, *, rtol: float | None = None,
          atol: float | None = None, max_ulp: int | None = None,
          kwargs: dict | None = None) -> Report:
  """Runs `fn(**kwargs)` (or takes the outputs given) and compares it with the recording."""
  recordings.require(os.fspath(directory))  # fail before a long run, not after it
  outputs, producer = _outputs_and_producer(fn_or_outputs, kwargs)
  recorded = load(directory)  # after the run: a multi-process job knows its process index now
  tree, leaves = recordings.outputs_to_leaves(outputs)
  tol = choose_tolerance(recorded.producer, producer, rtol=rtol, atol=atol, max_ulp=max_ulp)
  return compare(recorded, Recording(tree, leaves, producer), tol,
                 label=f"checking against {recorded.directory}")


def compare_recordings(expected_dir: str | os.PathLike, actual_dir: str | os.PathLike, *,
                       rtol: float | None = None, atol: float | None = None,
                       max_ulp: int | None = None) -> Report:
  """Compares two recordings (e.g. made on two JAX versions) leaf by leaf."""
  expected = recordings.read(os.fspath(expected_dir))
  actual = recordings.read(os.fspath(actual_dir))
  tol = choose_tolerance(expected.producer, actual.producer, rtol=rtol, atol=atol,
                         max_ulp=max_ulp)
  return compare(expected, actual, tol, label=f"comparing {actual_dir} with {expected_dir}")


def assert_matches_recording(fn: Callable[..., Any] | Any, directory: str | os.PathLike, *,
                             rtol: float | None = None, atol: float | None = None,
                             max_ulp: int | None = None, **kwargs: Any) -> Report:
  """Raises AssertionError with the full report unless `fn(**kwargs)` matches the recording."""
  report = check(fn, directory, rtol=rtol, atol=atol, max_ulp=max_ulp, kwargs=kwargs)
  if not report.ok:
    raise AssertionError(str(report))
  return report
