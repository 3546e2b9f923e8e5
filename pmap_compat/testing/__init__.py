"""Record what a program computes on the JAX you run today; check it anywhere later.

In the style of `numpy.testing` / `chex`, for migrations off `jax.pmap`: record the
outputs of your pmap code once (golden outputs), then check the same program under
`pmap_compat.patched()`, as converted code, or on a newer JAX against that recording.
Uses only public JAX and numpy, so it imports and works on every JAX from 0.4.35 to
0.10.2, also where the rest of `pmap_compat` does not.

Command line (PROGRAM is a .py file or a module name; it defines `run(**kwargs)`, or the
function named by --function, returning a pytree of arrays)::

  python -m pmap_compat.testing record PROGRAM --out DIR [--function NAME] [--kwargs JSON]
      [--patched] [--calls K] [--max-call-bytes N]
  python -m pmap_compat.testing check PROGRAM --against DIR [--rtol R] [--atol A]
      [--max-ulp N] [--function NAME] [--kwargs JSON] [--patched] [--per-call]

`--patched` runs the program (import included) under `pmap_compat.patched()` (jax 0.6.0
only). `check` prints one line per leaf (path, dtype and shape, `identical` or the
number of differing elements with max ulp / max abs / max rel difference), the worst
leaf, and PASS or FAIL. Exit status: 0 all within tolerance; 1 some leaf beyond
tolerance, or a tree structure, type, dtype or shape mismatch; 2 nothing was compared
(bad arguments, no recording, the program raised).

Tolerance. By default a check is bit for bit when the recording was made with the same
jax and jaxlib version, and otherwise allows `CROSS_VERSION_MAX_ULP` (16) ulp per
floating-point element: across XLA versions results move by a few last bits (jax
0.10.2's own jax.pmap and the codemod output on 0.10.2 differ from legacy jax.pmap on
0.6.0 by at most 7 ulp at leaf scale on the shipped examples; the bound leaves room
for loops that compound such differences). An element is within N ulp when it is at
most N representable values from the recorded one, or differs by at most N ulp of the
leaf's largest recorded magnitude ("at leaf scale": values that cancel toward zero
move many of their own ulp). A float64 leaf whose recorded values are all float32
values (`float(loss)` of a float32 loss) is measured in float32 ulp. Integer, bool,
string and PRNG-key leaves must stay identical. Passing any of rtol / atol / max_ulp replaces the default (the others
become 0): an element then passes when it is within max_ulp ulp as above or
|new - recorded| <= atol + rtol * |recorded|. Identical infinities and NaNs are
identical; a NaN with another payload or a zero with the other sign is "value-equal,
bits differ", within any tolerance but bit for bit (which names it, and fails); a
non-finite value that matches nothing (inf against a finite value or -inf, NaN against a
number) fails any tolerance. The scales are the largest finite magnitudes.

Per call (`check --per-call`). Rounding differences between XLA versions compound over
a training loop's steps, and one ulp can change an MCMC chain's path, so a long program
may end far from a recording that it follows call by call. So `record` also stores, for
each pmap site, the inputs and outputs of its first K calls (`--calls`, default 3) and
how often it was called, and `check --per-call` runs the program again (on any JAX;
under JAX's own jax.pmap, `pmap_compat`, or as the codemod's converted code) and, at
each recorded call, runs the site on the recorded inputs, compares its outputs with the
recorded ones and hands the recorded outputs back, placed as that implementation places
its outputs, so the run follows the recorded trajectory. It reports per site and call
`identical` or the worst leaf's ulp / abs / rel difference, the first call beyond
tolerance, sites recorded but never reached and sites reached but never recorded (all
three fail the check), and, as information, how the replayed run's final outputs compare
with the recording. Tolerance per call: bit for bit on the recording's jax, else
`PER_CALL_MAX_ULP` (6) ulp; the same --rtol / --atol / --max-ulp replace it.

Loops inside a call (a sampler's chain, a training epoch) compound rounding within the
call, so `record` also runs each recorded call of a site that holds `scan` or `while`
loops once more with its loops stepped (`loop_steps`): per loop and device, the initial
values of what its iterations change, each iteration's slice of the scanned operands and
each iteration's result go to the host and are stored (`loop_records`), with the outputs
of that run (`--no-loop-steps` stores calls whole). `check --per-call` runs such a call
stepped too, hands every iteration the recorded values to compute from and to go on
with, and compares each with this run's and the call's outputs with the recorded ones; a
value is also within tolerance when it differs by at most the bound in ulp of the
largest value compared with it (one part of one iteration). It names the first loop,
iteration and device beyond tolerance, and loop steps only one run has.

A site is the function given to `jax.pmap` / `pmap_compat.pmap`, identified by its
module and qualified name (which the codemod keeps; file and line are shown as a hint).
While recording or checking, the CLI observes every pmap site the program creates
(`sites.observing`): `jax.pmap`, `pmap_compat.pmap` and `pmap_compat.patched()` return
callables that see each top-level call; in converted code, `jax.jit` over a function the
codemod's support module made (it answers `pmap_site_function(fn)`) does the same. The
program must create its sites after observing began: the CLI imports it inside. Calls
made inside jit, grad or another pmap are part of that computation and are not seen.
Replicated leaves (identical copies along the device axis) are stored once; storing
more than `--max-call-bytes` (default 1 GiB) stops the recording with an error naming
that option. Library: `recording_calls(dir, calls_per_site=K, max_bytes=N,
step_loops=True)` and
`checking_calls(dir, ...)` (context managers; import the program inside, and call
`record` / `check` inside), then `replayer.report(final_report)`.

Random numbers: jax 0.5.0 changed the default of `jax_threefry_partitionable`, so
programs that draw random numbers record different values on jax < 0.5; `check` says so
when the flag differs from the recording's. Setting JAX_THREEFRY_PARTITIONABLE to the
recorded value reproduces jax 0.4's draws on 0.6.0 but not on 0.10.2: for that, record on
jax < 0.5 with JAX_THREEFRY_PARTITIONABLE=1.

Multi-process programs (`jax.process_count() > 1` once the function returned): every
process records into `DIR/process_<i>/` and checks against its own recording. Start
each process with the same command, as the job itself is started.

Recording format (version 1; stable across JAX versions, readable with numpy alone)::

  DIR/manifest.json   {"format": "pmap_compat.testing/1",
                       "producer": {jax, jaxlib, numpy, python, platform, device_count,
                                    process_index, process_count,
                                    pmap: what jax.pmap was ("legacy jax.pmap",
                                      "pmap_compat.pmap", "jax.pmap (JAX's shard_map-based
                                      pmap)", or none),
                                    produced_by: that, or "code that does not call pmap
                                      (converted code / shard_map)" when the program's
                                      source never mentions pmap,
                                    program, function, kwargs,
                                    threefry_partitionable},
                       "metadata": {...anything the caller of record() adds},
                       "tree": structure,
                       "leaves": [{"path", "kind", "dtype", "shape", "file" | "value",
                                   "stored_as"?, "key_impl"?}, ...]}
  DIR/leaves/00000.npy ...  one file per array leaf (numpy .npy, no pickles)
  DIR/calls/...             the per-call part (format in pmap_compat/testing/calls.py)

`tree` is nested JSON: {"type": "dict", "keys": [...], "children": [...]} (keys in JAX's
order: sorted, insertion order for an OrderedDict, which gets a "class" entry as does a
defaultdict; a key that is not a string is {"type", "repr"}), {"type": "list"|"tuple",
"children": [...]}, {"type": "namedtuple", "class", "fields", "children"},
{"type": "none"}, {"type": "node", "class", "keys", "children"} for any other pytree
node registered with JAX, and {"type": "leaf"}. Leaves are listed in JAX's flattening
order; `path` is the key path as `jax.tree_util.keystr` spells it (`['params']['w']`,
`[0]`, `.field`; "" for a lone leaf). `kind` is jax.Array, jax.Array[key], numpy.ndarray,
numpy.scalar or python.bool/int/float/complex/str. `dtype` is numpy's name
(`float32`, `bfloat16`, ... `float0`). Typed PRNG key arrays are stored as their key data
(`jax.random.key_data`) with `key_impl` (e.g. `threefry2x32`); `shape` and `dtype`
(e.g. `key<fry>`) are the key array's own. Dtypes .npy cannot name (bfloat16, float8_*,
int4, ...) are stored as unsigned integers of the same width (`stored_as`) and viewed
back on reading. float0 leaves have no file; python.str leaves keep `value` inline.

Library::

  record(fn_or_outputs, directory, *, kwargs=None, metadata=None) -> Recording
  load(directory) -> Recording
  check(fn_or_outputs, directory, *, rtol=None, atol=None, max_ulp=None, kwargs=None) -> Report
  assert_matches_recording(fn, directory, *, rtol=None, atol=None, max_ulp=None, **kwargs)
  compare_recordings(expected_dir, actual_dir, *, rtol=None, atol=None, max_ulp=None) -> Report

`Report.ok`, `.leaves` (LeafReport: path, shape, dtype, status, max_ulp, max_abs, max_rel),
`.structure`, `.worst`, and `str(report)` is the text the CLI prints.
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
