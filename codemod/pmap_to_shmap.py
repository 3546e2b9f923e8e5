"""Command line: rewrite ``jax.pmap`` call sites under PATH... into ``jax.jit(shard_map(...))``.

By default a unified diff is printed and nothing is written; ``--in-place`` writes the
files, ``--check`` exits 1 when anything would change (for CI). The report (stderr, or
``--report FILE``) has one ``file:line:col SEVERITY message`` line per finding and the
totals. Exit status: 0 ok, 1 changes pending under --check, 2 internal error or bad path.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from typing import Sequence

from codemod.findings import FileResult, Totals
from codemod.runner import Options, discover, transform_file, write_atomically

_PROGRESS_FROM = 100  # files; smaller runs print no progress lines


def default_target() -> str:
  """'experimental' for an installed jax older than 0.6.1 (no jax.shard_map), else 'jax'."""
  try:
    from importlib.metadata import PackageNotFoundError, version
    installed = version("jax")
  except Exception:  # PackageNotFoundError, or no metadata at all
    return "jax"
  numbers = []
  for part in installed.split(".")[:3]:
    digits = "".join(ch for ch in part if ch.isdigit())
    numbers.append(int(digits or 0))
  return "experimental" if tuple(numbers) < (0, 6, 1) else "jax"


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="pmap-to-shmap",
      description="Rewrite jax.pmap call sites into jax.jit(shard_map(...)) with equivalent specs.")
  p.add_argument("paths", nargs="+", metavar="PATH", help=".py files, notebooks or directories")
  mode = p.add_mutually_exclusive_group()
  mode.add_argument("--diff", action="store_true", help="print a unified diff (default)")
  mode.add_argument("--check", action="store_true", help="exit 1 if anything would change")
  mode.add_argument("--in-place", action="store_true", help="rewrite files in place")
  p.add_argument("--report", metavar="FILE", help="write the site report to FILE (default: stderr)")
  p.add_argument("--jobs", type=int, default=1, metavar="N", help="worker processes")
  p.add_argument("--target", choices=("experimental", "jax"),
                 help="which shard_map API to emit: jax.experimental.shard_map (jax < 0.6.1) "
                      "or jax.shard_map; default: chosen from the installed jax")
  p.add_argument("--strategy", choices=("shard_map", "shim"), default="shard_map",
                 help="shard_map: rewrite to jax.jit(shard_map); shim: jax.pmap -> pmap_compat.pmap")
  p.add_argument("--multihost", action="store_true",
                 help="emit host-local <-> global conversions for multi-process code")
  return p


def _run_all(files: list[str], options: Options, jobs: int) -> list[FileResult]:
  show = len(files) >= _PROGRESS_FROM
  step = max(1, len(files) // 10)
  results: list[FileResult] = []

  def progress(done: int) -> None:
    if show and (done % step == 0 or done == len(files)):
      print(f"pmap-to-shmap: {done}/{len(files)} files", file=sys.stderr, flush=True)

  if jobs > 1 and len(files) > 1:
    # Forking a process that already runs JAX's threads can deadlock; spawn then.
    context = multiprocessing.get_context("spawn" if "jax" in sys.modules else None)
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
      for result in pool.map(transform_file, files, [options] * len(files), chunksize=8):
        results.append(result)
        progress(len(results))
  else:
    for path in files:
      results.append(transform_file(path, options))
      progress(len(results))
  return results


def main(argv: Sequence[str] | None = None) -> int:
  args = build_parser().parse_args(argv)
  if args.jobs < 1:
    print("pmap-to-shmap: error: --jobs must be at least 1", file=sys.stderr)
    return 2
  missing = [p for p in args.paths if not os.path.exists(p)]
  if missing:
    print(f"pmap-to-shmap: error: no such file or directory: {', '.join(missing)}",
          file=sys.stderr)
    return 2
  options = Options(target=args.target or default_target(), strategy=args.strategy,
                    multihost=args.multihost)
  files = list(dict.fromkeys(discover(args.paths)))
  results = _run_all(files, options, args.jobs)

  totals = Totals()
  lines = []
  for result in results:
    totals.add(result)
    lines.extend(f.format(result.path) for f in result.findings)
    if not result.changed:
      continue
    if args.in_place:
      write_atomically(result.path, result.new_source)
    elif not args.check:
      sys.stdout.write(result.diff)
  lines.append(totals.format())
  report = "\n".join(lines) + "\n"
  if args.report:
    with open(args.report, "w", encoding="utf-8") as f:
      f.write(report)
  else:
    sys.stderr.write(report)
  sys.stdout.flush()
  if totals.internal_errors:
    return 2
  if args.check and totals.files_changed:
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
