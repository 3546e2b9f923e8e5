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
converted files import. By default each package gets its own copy inside its top-level
package (``flax/_pmap_shard_map.py``: an installed package ships it), scripts outside
packages get ``pmap_shard_map.py`` in their own directory (found when they run), and a
notebook gets the support code as a cell of its own; ``--support-module`` /
``--support-root`` put one module, for every ``.py`` file, where they say.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import multiprocessing
import os
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor
from collections.abc import Callable, Iterator, Sequence

from codemod import files, import_style, pmap_patches, repo_formatter, support_module
from codemod.findings import FileResult, Finding, Severity, Totals
from codemod.runner import Options, transform_file, write_result

EXIT_OK, EXIT_CHANGES_PENDING, EXIT_INTERNAL_ERROR, EXIT_UNREADABLE_OR_UNWRITABLE = 0, 1, 2, 3

_PROGRESS_FROM = 100  # files; smaller runs print no progress lines


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="pmap-to-shmap",
      description="Rewrite jax.pmap call sites into jax.jit(shard_map(...)) with equivalent specs.")
  p.add_argument("paths", nargs="+", metavar="PATH", help=".py files, notebooks or directories")
  mode = p.add_mutually_exclusive_group()
  mode.add_argument("--diff", action="store_true", help="print a unified diff (default)")
  mode.add_argument("--check", action="store_true", help="exit 1 if anything would change")
  mode.add_argument("--in-place", action="store_true", help="rewrite files in place")
  p.add_argument("--report", metavar="FILE",
                 help="write the site report to FILE, '-' for stdout (default: stderr)")
  p.add_argument("--follow-symlinks", action="store_true",
                 help="also convert files and walk directories that symlinks lead to outside "
                      "the given paths (the link's target is written, never the link); by "
                      "default such links are reported and left alone")
  p.add_argument("--jobs", type=int, default=1, metavar="N", help="worker processes")
  p.add_argument("--target", choices=("experimental", "jax"),
                 help="which shard_map API to emit: jax.experimental.shard_map (jax < 0.6.1) "
                      "or jax.shard_map; default: for each file, the one that runs on every "
                      "jax its repository declares (pyproject, setup.cfg/py, requirements), "
                      "else the installed jax's")
  p.add_argument("--strategy", choices=("shard_map", "shim"), default="shard_map",
                 help="shard_map: rewrite to jax.jit(shard_map); shim: jax.pmap -> pmap_compat.pmap")
  p.add_argument("--multihost", action="store_true",
                 help="accepted for old command lines: every converted site is correct with "
                      "any number of processes")
  p.add_argument("--support-module", metavar="MODULE",
                 help="dotted name of the one shared module every converted .py file imports "
                      f"(default: {support_module.PACKAGE_NAME} inside each file's top-level "
                      f"package, {support_module.DEFAULT_NAME} next to each script outside packages)")
  p.add_argument("--support-root", metavar="DIR",
                 help="directory that module is written under, the one on sys.path when the "
                      "converted code runs (default: the directory holding every PATH)")
  return p


def default_support_root(paths: Sequence[str]) -> str:
  dirs = [os.path.abspath(p if os.path.isdir(p) else os.path.dirname(p) or ".") for p in paths]
  return os.path.commonpath(dirs)


Key = tuple[str, str]  # (root, dotted name) of a support module


def _support_users(results: list[FileResult]) -> dict[Key, tuple[list[str], set[str]]]:
  """Each support module the files import after this run, with the files importing it
  and the names they import from it."""
  users: dict[Key, tuple[list[str], set[str]]] = {}
  for result in results:
    if result.internal_error or result.support_key is None or not result.support_imports:
      continue
    paths, names = users.setdefault(result.support_key, ([], set()))
    paths.append(result.path)
    names |= result.support_imports
    # A file converted by an earlier run, whose support module is gone: its sites may
    # need every flag's code.
    earlier = not result.sites_converted and support_module.read(*result.support_key) is None
    names |= support_module.FEATURES if earlier else result.support_flags
  return users


def _plan(args, options: Options, paths: list[str],
          texts: dict[str, str]) -> dict[str, support_module.Placement]:
  """The support module each file imports (``texts``: the .py files' sources): planned
  once, before the run, which passes it on."""
  if not options.per_file_support:
    shared = support_module.Placement(args.support_root, args.support_module,
                                      args.support_module)
    return {path: shared for path in paths}
  return {path: support_module.placement(path, texts.get(path, ""), options.run_names)
          for path in paths}


def _python_texts(paths: list[str]) -> Iterator[tuple[str, str]]:
  """(path, text) of each readable, decodable .py file among ``paths``."""
  for path in paths:
    if path.endswith(".py"):
      try:
        with open(path, encoding="utf-8") as f:
          yield path, f.read()
      except (OSError, UnicodeDecodeError):
        continue  # transform_file reports it


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
    # Each worker gets its files' part of the plan, not the whole run's.
    each = [dataclasses.replace(options, placements={
        path: options.placements[path]} if path in options.placements else {}) for path in files]
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
      for result in pool.map(transform_file, files, each, chunksize=8):
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
  explicit = args.support_module is not None or args.support_root is not None
  args.support_module = args.support_module or support_module.DEFAULT_NAME
  args.support_root = args.support_root or default_support_root(args.paths)
  try:
    support_path = support_module.path_for(args.support_root, args.support_module)
  except ValueError as e:
    print(f"pmap-to-shmap: error: {e}", file=sys.stderr)
    return EXIT_INTERNAL_ERROR
  found = files.discover(args.paths, follow_symlinks=args.follow_symlinks)
  python = list(_python_texts(found.sources))
  options = Options(target=args.target, strategy=args.strategy,
                    multihost=args.multihost, support_module=args.support_module,
                    per_file_support=not explicit,
                    pmap_patchers=pmap_patches.patchers(text for _, text in python),
                    module_replacements=pmap_patches.module_replacements(python),
                    run_names=support_module.run_names_of(python))
  plan = _plan(args, options, found.sources, dict(python))
  options = dataclasses.replace(options, placements=plan)
  keys = sorted({(place.root, place.name) for place in plan.values()})
  foreign = [key for key in keys if support_module.status_at(*key) is support_module.Status.FOREIGN]
  if args.strategy == "shard_map" and foreign:
    for key in foreign:
      print(f"pmap-to-shmap: error: {support_module.foreign_message(*key)}", file=sys.stderr)
    return EXIT_INTERNAL_ERROR
  support_dirs = {os.path.dirname(support_module.path_for(*key)) for key in keys}
  notices = found.notices + files.temp_files(
      [*found.directories, *sorted(support_dirs - set(found.directories))],
      remove=args.in_place)
  sources = [f for f in found.sources if os.path.realpath(f) != os.path.realpath(support_path)]
  results = _run_all(sources, options, args.jobs)
  users = _support_users(results)
  changes = {key: paths for key, (paths, names) in sorted(users.items())
             if support_module.status_at(*key, names) is not support_module.Status.CURRENT}

  totals = Totals()
  lines: list[str] = []
  for notice in notices:
    totals.add_notice(notice.finding, notice.failed)
    lines.append(notice.finding.format(notice.path))
  old_support = {key: support_module.read(*key) for key in changes}
  # Written before the files that import them: where one cannot be, its files stay
  # unchanged rather than import a module that is not there.
  failures = {key: failure for key in changes
              if args.in_place and (failure := _write_support(*key, users[key][1], changes[key]))
              is not None}
  unwritable = {path for key in failures for path in changes[key]}
  for result in results:
    if args.in_place:
      if result.changed and result.path in unwritable:
        result.not_written("cannot write the support module it imports")
      else:
        write_result(result)
    elif result.changed and not args.check:
      sys.stdout.write(result.diff)
    totals.add(result)
    lines.extend(f.format(result.path) for f in result.findings)
  lines.extend(_unrun_formatters(results))
  for key in changes:
    if key in failures:
      totals.add_notice(failures[key].finding, failures[key].failed)
      lines.append(failures[key].finding.format(_display_path(failures[key].path)))
      continue
    path = support_module.path_for(*key)
    verb = "written" if old_support[key] is None else "updated from an older version"
    lines.append(f"{_display_path(path)}:1:1 INFO support module {key[1]} {verb}; the "
                 "converted files import it")
    if not args.in_place and not args.check:
      names = support_module.wanted(old_support[key], users[key][1])
      sys.stdout.write(_new_file_diff(_display_path(path), old_support[key] or "",
                                      _support_layout(*key, changes[key])(
                                          support_module.source(names))))
  lines.append(totals.format())
  report = "\n".join(lines) + "\n"
  sys.stdout.flush()
  report_written = _write_report(args.report, report)
  if totals.internal_errors:
    return EXIT_INTERNAL_ERROR
  if totals.io_errors or not report_written:
    return EXIT_UNREADABLE_OR_UNWRITABLE
  if args.check and (totals.files_changed or changes):
    return EXIT_CHANGES_PENDING
  return EXIT_OK


def _write_report(path: str | None, report: str) -> bool:
  """Writes the report to ``path`` (stderr if None, stdout if "-"); False if it could not
  (it then goes to stderr, with the reason)."""
  if path == "-":
    sys.stdout.write(report)
    return True
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


def _write_support(root: str, name: str, names: set[str],
                   users: list[str]) -> files.Notice | None:
  """Writes the support module for files calling ``names``; the failure, if it could not
  be written."""
  try:
    support_module.write(root, name, names, _support_layout(root, name, users))
  except OSError as e:
    path = support_module.path_for(root, name)
    return files.Notice(path, Finding(1, 1, Severity.ERROR, f"cannot write the support "
                                      f"module {name}: {e.strerror or e}"), failed=True)
  return None


def _unrun_formatters(results: list[FileResult]) -> list[str]:
  """An INFO line per repository whose formatter the codemod does not run (yapf, or pyink
  where it is not installed) that holds changed files: those keep the codemod's layout."""
  changed: dict[tuple[str, str], int] = {}
  for result in results:
    found = repo_formatter.nearest(result.path) if result.changed else None
    if found is not None and found[1] not in ("ruff", "black") and not repo_formatter.runs(
        found[1]):
      changed[found[:2]] = changed.get(found[:2], 0) + 1
  return [f"{_display_path(os.path.join(directory, 'pyproject.toml'))}:1:1 INFO the "
          f"repository formats with {name} ([tool.{name}]), which the codemod does not run"
          f"{' (not installed here)' if name == 'pyink' else ''}: "
          f"{count} converted file{'s' * (count != 1)} below it keep{'s' * (count == 1)} "
          f"the codemod's layout; run {name} on {'it' if count == 1 else 'them'} before review"
          for (directory, name), count in sorted(changed.items())]


def _support_layout(root: str, name: str, users: list[str]) -> Callable[[str], str]:
  """How the support module's text is laid out where it is written: by the formatter its
  repository configures (its check covers the new file too) where that formatter had
  formatted a file that imports it, else as the codemod has it, with the blank lines
  after its imports that the repository's import sorter asks for. Called before the
  converted files are written: ``users`` are still the originals on disk."""
  path = support_module.path_for(root, name)
  sorter = import_style.configured(path)
  after = -1 if sorter is None else sorter.lines_after_imports

  def spaced(text: str) -> str:  # the sorter's blank lines after the imports
    return support_module.spaced_after_imports(text, after)

  formatter = repo_formatter.configured(path)
  if formatter is None or not repo_formatter.formats_any(formatter, users):
    return spaced
  return lambda text: spaced(repo_formatter.reformatted(formatter, text, path) or text)


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
