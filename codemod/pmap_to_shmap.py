"""Command line: rewrite ``jax.pmap`` call sites under PATH... into ``jax.jit(shard_map(...))``.

By default a unified diff is printed and nothing is written; ``--in-place`` writes the
files, ``--check`` exits 1 when anything would change (for CI). The report (stderr, or
``--report FILE``) has one ``file:line:col SEVERITY message`` line per finding and the
totals. Exit status: 0 ok (ERROR findings about a file's content included), 1 changes
pending under --check, 2 internal error, bad path or a foreign file where the support
module goes, 3 a file or directory could not be read, listed or written (each an ERROR
in the report; every other file was processed). The first that applies, in the order
2, 3, 1, 0.

A thin layer over ``ConvertPmapCommand`` (which ``python -m libcst.tool codemod`` runs
too): it adds notebooks, parallel jobs, the report, and the support module the
converted files import, written once under ``--support-root`` (default: the directory
holding every PATH).
"""
from __future__ import annotations

import argparse
import difflib
import multiprocessing
import os
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor
from collections.abc import Sequence

from codemod import files, support_module
from codemod.findings import FileResult, Finding, Severity, Totals
from codemod.runner import Options, transform_file, write_result

EXIT_OK, EXIT_CHANGES_PENDING, EXIT_INTERNAL_ERROR, EXIT_UNREADABLE_OR_UNWRITABLE = 0, 1, 2, 3

_PROGRESS_FROM = 100  # files; smaller runs print no progress lines


def default_target() -> str:
  """'experimental' for an installed jax older than 0.6.1 (no jax.shard_map), else 'jax'."""
  try:
    from importlib.metadata import version
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
  p.add_argument("--follow-symlinks", action="store_true",
                 help="also convert files and walk directories that symlinks lead to outside "
                      "the given paths (the link's target is written, never the link); by "
                      "default such links are reported and left alone")
  p.add_argument("--jobs", type=int, default=1, metavar="N", help="worker processes")
  p.add_argument("--target", choices=("experimental", "jax"),
                 help="which shard_map API to emit: jax.experimental.shard_map (jax < 0.6.1) "
                      "or jax.shard_map; default: chosen from the installed jax")
  p.add_argument("--strategy", choices=("shard_map", "shim"), default="shard_map",
                 help="shard_map: rewrite to jax.jit(shard_map); shim: jax.pmap -> pmap_compat.pmap")
  p.add_argument("--multihost", action="store_true",
                 help="emit host-local <-> global conversions for multi-process code")
  p.add_argument("--support-module", default=support_module.DEFAULT_NAME, metavar="MODULE",
                 help="dotted name of the shared module the converted files import "
                      f"(default: {support_module.DEFAULT_NAME})")
  p.add_argument("--support-root", metavar="DIR",
                 help="directory the support module is written under, the one on sys.path "
                      "when the converted code runs (default: the directory holding every PATH)")
  return p


def default_support_root(paths: Sequence[str]) -> str:
  dirs = [os.path.abspath(p if os.path.isdir(p) else os.path.dirname(p) or ".") for p in paths]
  return os.path.commonpath(dirs)


def _imports_support(result: FileResult, needle: bytes) -> bool:
  if result.internal_error:
    return False
  if result.changed:
    return needle in (result.new_source or b"")
  try:
    with open(result.path, "rb") as f:  # converted by an earlier run
      return needle in f.read()
  except OSError:
    return False  # already reported as unreadable


def _support_module_change(args, results: list[FileResult]) -> tuple[str, bytes] | None:
  """(path, text) of the support module when a converted file imports it and the copy
  under the support root is missing or stale; None otherwise."""
  needle = _support_import(args)
  if not any(_imports_support(r, needle) for r in results):
    return None
  if support_module.status_at(args.support_root, args.support_module) is (
      support_module.Status.CURRENT):
    return None
  return (support_module.path_for(args.support_root, args.support_module),
          support_module.source().encode("utf-8"))


def _support_import(args) -> bytes:
  return f"from {args.support_module} import".encode()


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
  try:
    return _main(argv)
  except Exception:  # pylint: disable=broad-except
    # A bug must not exit 1, which --check uses for "changes pending".
    traceback.print_exc()
    print("pmap-to-shmap: internal error", file=sys.stderr)
    return EXIT_INTERNAL_ERROR


def _main(argv: Sequence[str] | None) -> int:
  args = build_parser().parse_args(argv)
  if args.jobs < 1:
    print("pmap-to-shmap: error: --jobs must be at least 1", file=sys.stderr)
    return EXIT_INTERNAL_ERROR
  missing = [p for p in args.paths if not os.path.exists(p)]
  if missing:
    print(f"pmap-to-shmap: error: no such file or directory: {', '.join(missing)}",
          file=sys.stderr)
    return EXIT_INTERNAL_ERROR
  args.support_root = args.support_root or default_support_root(args.paths)
  try:
    support_path = support_module.path_for(args.support_root, args.support_module)
  except ValueError as e:
    print(f"pmap-to-shmap: error: {e}", file=sys.stderr)
    return EXIT_INTERNAL_ERROR
  if (args.strategy == "shard_map" and support_module.status_at(
      args.support_root, args.support_module) is support_module.Status.FOREIGN):
    print(f"pmap-to-shmap: error: "
          f"{support_module.foreign_message(args.support_root, args.support_module)}",
          file=sys.stderr)
    return EXIT_INTERNAL_ERROR
  options = Options(target=args.target or default_target(), strategy=args.strategy,
                    multihost=args.multihost, support_module=args.support_module)
  found = files.discover(args.paths, follow_symlinks=args.follow_symlinks)
  notices = found.notices + files.temp_files(
      [*found.directories, os.path.dirname(support_path)], remove=args.in_place)
  sources = [f for f in found.sources if os.path.realpath(f) != os.path.realpath(support_path)]
  results = _run_all(sources, options, args.jobs)
  support = _support_module_change(args, results)

  totals = Totals()
  lines: list[str] = []
  for notice in notices:
    totals.add_notice(notice.finding, notice.failed)
    lines.append(notice.finding.format(notice.path))
  needle = _support_import(args)
  old_support = support_module.read(args.support_root, args.support_module)
  # Written before the files that import it: if it cannot be, they stay unchanged rather
  # than import a module that is not there.
  support_failure = _write_support(args) if support is not None and args.in_place else None
  for result in results:
    if args.in_place:
      if support_failure is not None and result.changed and _imports_support(result, needle):
        result.not_written("cannot write the support module it imports")
      else:
        write_result(result)
    elif result.changed and not args.check:
      sys.stdout.write(result.diff)
    totals.add(result)
    lines.extend(f.format(result.path) for f in result.findings)
  if support_failure is not None:
    totals.add_notice(support_failure.finding, support_failure.failed)
    lines.append(support_failure.finding.format(_display_path(support_failure.path)))
  elif support is not None:
    path, text = support
    verb = "written" if old_support is None else "updated from an older version"
    lines.append(f"{_display_path(path)}:1:1 INFO support module {args.support_module} "
                 f"{verb}; the converted files import it")
    if not args.in_place and not args.check:
      sys.stdout.write(_new_file_diff(_display_path(path), old_support or "",
                                      text.decode("utf-8")))
  lines.append(totals.format())
  report = "\n".join(lines) + "\n"
  sys.stdout.flush()
  report_written = _write_report(args.report, report)
  if totals.internal_errors:
    return EXIT_INTERNAL_ERROR
  if totals.io_errors or not report_written:
    return EXIT_UNREADABLE_OR_UNWRITABLE
  if args.check and (totals.files_changed or support is not None):
    return EXIT_CHANGES_PENDING
  return EXIT_OK


def _write_report(path: str | None, report: str) -> bool:
  """Writes the report to ``path`` (stderr if None); False if it could not (it then goes
  to stderr, with the reason)."""
  if path is not None:
    try:
      with open(path, "w", encoding="utf-8") as f:
        f.write(report)
      return True
    except OSError as e:
      sys.stderr.write(f"pmap-to-shmap: error: cannot write the report {path}: "
                       f"{e.strerror or e}\n")
  sys.stderr.write(report)
  return path is None


def _write_support(args) -> files.Notice | None:
  """Writes the support module; the failure, if it could not be written."""
  try:
    support_module.write(args.support_root, args.support_module)
  except OSError as e:
    path = support_module.path_for(args.support_root, args.support_module)
    return files.Notice(path, Finding(1, 1, Severity.ERROR, f"cannot write the support "
                                      f"module {args.support_module}: {e.strerror or e}"),
                        failed=True)
  return None


def _display_path(path: str) -> str:
  """`path` relative to the working directory when it lies below it, as the PATHs given."""
  relative = os.path.relpath(path)
  return path if relative.startswith(os.pardir) else relative


def _new_file_diff(path: str, old: str, new: str) -> str:
  return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                      fromfile="/dev/null" if not old else f"a/{path}",
                                      tofile=f"b/{path.lstrip(os.sep)}"))


if __name__ == "__main__":
  sys.exit(main())
