"""Running the codemod over one file: read, transform, diff; and writing the result back.

``transform_file`` never raises: a file that cannot be read, decoded or parsed becomes
an ERROR entry and is skipped; a crash inside the transform is an internal error (exit 2).
``write_result`` turns a failed write into an ERROR for that file (the file unchanged).
The command is the one ``python -m libcst.tool codemod`` runs; this layer reads files,
passes the options, collects what the command reported to its context, and runs the
repository's formatter over a converted file that formatter had written (``repo_formatter``).
The bytes libcst writes back keep the file's encoding and newline style.
"""
from __future__ import annotations

import ast
import dataclasses
import difflib
import os
import re
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field

import libcst as cst
from libcst.codemod import CodemodContext

from codemod import (files, notebook, notebook_support, pmap_patches, removed_names,
                     repo_formatter, support_module)
from codemod.findings import SITES_KEY, FileResult, Finding, Severity
from codemod.support_module import Placement


@dataclass(frozen=True)
class Options:
  target: str | None = None  # None: each file's own (codemod.targets.for_file)
  strategy: str = "shard_map"
  multihost: bool = False
  # How converted files import the support module; None puts the support code into the
  # file itself (a notebook's support cell from an earlier run).
  support_module: str | None = support_module.DEFAULT_NAME
  # Set: each .py file imports the support module ``support_module.placement`` gives it
  # (its package's copy, or one next to the script), not ``support_module``.
  per_file_support: bool = False
  # Functions that replace jax.pmap while they run: chex's, and the run's files' own
  # (pmap_patches.patchers).
  pmap_patchers: frozenset[str] = pmap_patches.KNOWN_PATCHERS
  # Where the run's files replace a module's own pmap (pmap_patches.module_replacements).
  module_replacements: tuple[pmap_patches.ModuleReplacement, ...] = ()
  # Directory outside any package -> the dotted name the run's files import its modules
  # by (support_module.run_names_of).
  run_names: Mapping[str, str] = field(default_factory=dict)
  # Path -> the support module that file imports, planned once for the run (the CLI's
  # plan); a file not in it gets support_placement's.
  placements: Mapping[str, Placement] = field(default_factory=dict)


def support_placement(path: str, text: str, options: Options) -> support_module.Placement | None:
  """The support module a converted file imports (a notebook too: the module goes next to
  it, where the notebook's kernel, started in its directory, imports it)."""
  if path in options.placements:
    return options.placements[path]
  if options.per_file_support:
    return support_module.placement(path, text, options.run_names)
  if options.support_module is None:
    return None
  return support_module.Placement("", options.support_module, options.support_module)


def make_command(options: Options, context: CodemodContext, source: str | None = None):
  if options.strategy == "shim":
    from codemod.shim import PmapToShimCommand
    return PmapToShimCommand(context)
  from codemod.convert_pmap import ConvertPmapCommand
  return ConvertPmapCommand(context, target=options.target, multihost=options.multihost,
                            support_module=options.support_module, source=source,
                            caller_writes_support=True, pmap_patchers=options.pmap_patchers,
                            module_replacements=options.module_replacements,
                            run_names=options.run_names)


@dataclass
class Transformed:
  module: cst.Module
  findings: list[Finding]
  sites_found: int
  sites_converted: int
  support_names: tuple[str, ...] = ()  # the support functions the new code calls


def transform_module(module: cst.Module, options: Options, filename: str = "<string>",
                     source: str | None = None) -> Transformed:
  """Runs the command on a parsed module and collects what it reported to the context.

  ``source`` is the module's text when the caller has it (it must be ``module.code``).
  """
  context = CodemodContext(filename=filename)
  new = make_command(options, context, source).transform_module(module)
  found, converted = context.scratch.get(SITES_KEY, (0, 0))
  findings = sorted((Finding.from_warning(w) for w in context.warnings),
                    key=lambda f: (f.line, f.column))
  return Transformed(new, findings, found, converted,
                     context.scratch.get(support_module.NAMES_KEY, ()))


def transform_file(path: str, options: Options) -> FileResult:
  result = FileResult(path)
  try:
    with open(path, "rb") as f:
      raw = f.read()
  except OSError as e:
    result.findings.append(Finding(1, 1, Severity.ERROR,
                                   f"cannot read the file, skipped: {e.strerror or e}"))
    result.io_error = True
    return result
  try:
    if path.endswith(".ipynb"):
      _transform_notebook(raw, result, options)
    elif path.endswith(".md"):
      _transform_markdown(raw, result, options)
    else:
      _transform_python(raw, result, options)
  except Exception:  # pylint: disable=broad-except
    # A bug in the codemod must not stop the run, but it must not pass silently either.
    result.internal_error = True
    last = traceback.format_exc().strip().splitlines()[-1]
    result.findings.append(Finding(1, 1, Severity.ERROR, f"internal error, file skipped: {last}"))
    result.changed, result.new_source, result.diff = False, None, ""
  return result


def write_result(result: FileResult) -> None:
  """Writes a changed file back; a failure leaves it unchanged and is reported for it."""
  if not result.changed or result.new_source is None:
    return
  try:
    files.write_atomically(result.path, result.new_source)
  except OSError as e:
    result.not_written(f"cannot write the file: {e.strerror or e}")


def _undecodable(result: FileResult, reason: object) -> None:
  # Python itself refuses such a file (PEP 263): a property of the file, like a syntax error.
  result.findings.append(Finding(1, 1, Severity.ERROR, f"cannot decode the file, skipped: "
                                 f"{reason} (non-UTF-8 text needs a coding declaration)"))


def _parse_error(result: FileResult, e: cst.ParserSyntaxError, first_line: int = 1) -> None:
  # The finding says where; libcst's own "@ line:col" counts a notebook's joined cells.
  message = re.sub(r"\s*@\s*\d+:\d+\.?$", "", str(e).strip().splitlines()[0])
  result.findings.append(Finding(e.raw_line + first_line - 1, e.raw_column + 1, Severity.ERROR,
                                 f"cannot parse the file, skipped: {message}"))


# A file none of whose text matches these has nothing to convert or report; it is
# still parsed (unparsable files are reported) but needs no metadata or rewrite.
_KEYWORDS = re.compile(r"pmap|device_put_(?:replicated|sharded)|process_(?:count|index)"
                       r"|host_(?:count|id)|jax_utils|"
                       + "|".join(sorted(removed_names.LAST_NAMES)))


# pmap inside IPython syntax (a magic's line, a shell escape, an opaque cell magic's body) is
# masked from the parse: reported instead of silently left alone. A help query is not code.
_PMAP = re.compile(r"\bpmap\b")
_HELP_QUERY = re.compile(r"\?{0,2}[\w.]+\?{0,2}")  # `jax.pmap?` only shows documentation


def _hides_pmap(syntax: str) -> bool:
  return bool(_PMAP.search(syntax)) and not _HELP_QUERY.fullmatch(syntax.strip())


_HIDDEN_PMAP = ("pmap inside IPython syntax (a magic or a shell escape) is not converted: "
                "rewrite it by hand")


def _hidden_pmaps(code: notebook.CellCode) -> list[Finding]:
  return [Finding(line, 1, Severity.WARNING, _HIDDEN_PMAP)
          for line in notebook.hidden_lines(code, _hides_pmap)]


def _transform_python(raw: bytes, result: FileResult, options: Options) -> None:
  try:
    module = cst.parse_module(raw)
  except cst.ParserSyntaxError as e:
    _parse_error(result, e)
    return
  except (SyntaxError, UnicodeDecodeError, LookupError) as e:  # libcst decodes it first
    _undecodable(result, e.msg if isinstance(e, SyntaxError) else e)
    return
  text = raw.decode(module.encoding)
  if support_module.is_support_module(text):
    return
  place = support_placement(result.path, text, options)
  _imports_of_support(result, place, [text])
  if not _KEYWORDS.search(text):
    return
  options = dataclasses.replace(options,
                                support_module=place.spelling if place is not None else None)
  out = transform_module(module, options, result.path, source=text)
  _collect(result, out)
  new_text = out.module.code
  if new_text != text and module.encoding.lower().replace("-", "") == "utf8":
    new_text = _formatted_as_before(text, new_text, result)
  if new_text != text:
    result.changed, result.new_source = True, new_text.encode(module.encoding)
    result.diff = _diff(text, new_text, result.path)


def _formatted_as_before(text: str, new_text: str, result: FileResult) -> str:
  """``new_text`` through the repository's formatter where that formatter had written
  ``text``, so the file still passes its check."""
  formatter = repo_formatter.formatter_of(text, result.path)
  if formatter is None:
    return new_text
  out = repo_formatter.reformatted(formatter, new_text, result.path)
  if out is None:
    result.findings.insert(0, Finding(1, 1, Severity.INFO, (
        f"the repository formats this file with {formatter.name}, which failed on the "
        f"converted file: it is left as the codemod laid it out; run {formatter.name} on it")))
    return new_text
  return out


def _transform_notebook(raw: bytes, result: FileResult, options: Options) -> None:
  try:
    code = notebook.read_notebook(raw)
  except ValueError as e:
    result.findings.append(Finding(1, 1, Severity.ERROR, f"not a readable notebook: {e}"))
    return
  converted = _converted_cells(code, result, options)
  if converted is None:
    return
  new_source, new_cell = converted
  new_raw = notebook.write_notebook(code, new_source, raw, new_cell)
  if new_raw is not None:
    result.changed, result.new_source = True, new_raw
    result.diff = _diff(code.source, notebook_support.with_cell(new_source, new_cell),
                        result.path + " (code cells)")


def _transform_markdown(raw: bytes, result: FileResult, options: Options) -> None:
  """MyST / jupytext markdown notebooks: their code cells are converted like a notebook's."""
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    if b"code-cell" in raw or b"jupytext" in raw:  # a notebook we cannot read
      _undecodable(result, e)
    return  # other markdown is none of the codemod's business
  code = notebook.read_markdown(text)
  if code is None:
    return  # plain markdown
  converted = _converted_cells(code, result, options)
  if converted is None:
    return
  new_source, new_cell = converted
  new_text = notebook.write_markdown(code, new_source)
  if new_text is not None and new_cell is not None:
    written = notebook.read_markdown(new_text)
    assert written is not None  # it was a markdown notebook before
    new_text = notebook_support.insert_markdown_cell(new_text, written, *new_cell)
  if new_text is not None:
    result.changed, result.new_source = True, new_text.encode("utf-8")
    result.diff = _diff(text, new_text, result.path)


def _converted_cells(code: notebook.CellCode, result: FileResult, options: Options
                     ) -> tuple[str, tuple[int, str] | None] | None:
  """A notebook's code cells (``.ipynb``, MyST or jupytext markdown) converted as one
  module: (their joined new source, a support cell to insert before a code cell, or
  None); None where they hold nothing to convert, or do not parse (an ERROR says where)."""
  support_cell = notebook_support.support_cell(code.cells)
  place = _notebook_placement(options, result.path, support_cell)
  source = notebook_support.masked(code.source, [] if support_cell is None else [support_cell])
  _imports_of_support(result, place, notebook.code_cells(source))
  hidden = _hidden_pmaps(code)
  if not hidden and not _KEYWORDS.search(source):
    return None  # no code the codemod handles
  parsed = _parsed_cells(code, support_cell, result)
  if parsed is None:
    return None
  module, source, masked, opaque = parsed
  out = transform_module(module, _notebook_options(options, place), result.path, source=source)
  _collect(result, out)
  result.findings = notebook.in_cells(code, opaque + result.findings + hidden)
  return notebook_support.placed(
      out.support_names if support_cell is not None else (), code.cells,
      notebook_support.unmasked(out.module.code, code.source, masked))


def _parsed_cells(code: notebook.CellCode, support_cell: int | None, result: FileResult
                  ) -> tuple[cst.Module, str, list[int], list[Finding]] | None:
  """The code cells parsed as one module: (the module, its source, the cells masked from
  it, an INFO for each cell masked as it does not parse). Masked are the support cell of
  an earlier run and, as in Jupyter, which parses each cell alone, cells that do not
  parse as Python (pseudo-code in a document) and hold nothing the codemod converts.
  None where a cell the codemod would read does not parse: an ERROR says where."""
  masked = [] if support_cell is None else [support_cell]
  source = notebook_support.masked(code.source, masked)
  try:
    return cst.parse_module(source), source, masked, []
  except cst.ParserSyntaxError as e:
    error = e
  cells = notebook.code_cells(source)
  failing = {}  # cell: its own error
  for i, cell in enumerate(cells):
    if i not in masked:
      try:
        cst.parse_module(cell)
      except cst.ParserSyntaxError as e:
        failing[i] = e
  opaque = [i for i in failing if not _KEYWORDS.search(cells[i])]
  if opaque:
    masked = sorted(masked + opaque)
    source = notebook_support.masked(code.source, masked)
    try:
      module = cst.parse_module(source)
    except cst.ParserSyntaxError as e:
      error = e
    else:
      return module, source, masked, [
          Finding(code.line_starts[i], 1, Severity.INFO,
                  "this cell does not parse as Python and holds no pmap: left as it is")
          for i in opaque]
  # Where a cell fails alone, its own error says where better than the joined cells'.
  first = next((i for i in failing if i not in opaque), None)
  if first is None:
    _parse_error(result, error)
  else:
    _parse_error(result, failing[first], code.line_starts[first])
  result.findings = notebook.in_cells(code, result.findings)
  return None


def _notebook_placement(options: Options, path: str, support_cell: int | None
                        ) -> support_module.Placement | None:
  """A notebook imports the support module like a script does; one that holds a support
  cell from an earlier run keeps calling what the cell defines (grown when needed)."""
  return support_placement(path, "", options) if support_cell is None else None


def _notebook_options(options: Options, place: support_module.Placement | None) -> Options:
  return dataclasses.replace(options, support_module=place.spelling if place else None)


def _imports_of_support(result: FileResult, place: support_module.Placement | None,
                        code: list[str]) -> None:
  """Records the support module the file imports, and what its ``code`` (the text, or a
  notebook's cells, each parsed alone as in Jupyter) imports from it already: an earlier
  run's conversion."""
  if place is None:
    return
  result.support_key = (place.root, place.name)
  module = place.spelling.lstrip(".")
  level = len(place.spelling) - len(module)
  for text in code:
    if place.spelling not in text:
      continue
    try:
      tree = ast.parse(text)
    except (SyntaxError, ValueError):
      continue
    result.support_imports |= {alias.name for node in ast.walk(tree)
                               if isinstance(node, ast.ImportFrom) and node.module == module
                               and node.level == level for alias in node.names}


def _collect(result: FileResult, out: Transformed) -> None:
  result.findings.extend(out.findings)
  result.sites_found = out.sites_found
  result.sites_converted = out.sites_converted
  result.support_flags = frozenset(out.support_names) & support_module.FEATURES
  if result.support_key is not None:
    result.support_imports |= frozenset(out.support_names) - support_module.FEATURES


def _diff(old: str, new: str, path: str) -> str:
  return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                      new.splitlines(keepends=True),
                                      fromfile=f"a/{path.lstrip(os.sep)}", tofile=f"b/{path.lstrip(os.sep)}"))

