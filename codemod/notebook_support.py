"""The support code of a notebook converted by an earlier version, as a code cell of its own.

A converted notebook imports the support module written next to it, as a script does.
Earlier versions put the support functions its converted sites call into the notebook: one
cell, before the first cell that uses them, holding just those functions and what they
call (cut from ``support_source.py``), and only the imports the notebook does not make
already. Its first line names the functions it holds. A rerun over such a notebook keeps
calling the cell's functions: when it converts more sites it rewrites the cell with the
union (``placed``), otherwise the cell is left as it is.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Collection

from codemod import notebook, support_module

_HEADER = ("# Support code pmap-to-shmap added for this notebook's converted pmap sites: {names}. "
           "Do not edit.\n")
_HEADER_RE = re.compile(r"# Support code pmap-to-shmap added for this notebook's converted pmap "
                        r"sites: ([\w, ]+)\. Do not edit\.")


def names_in(cell: str) -> tuple[str, ...] | None:
  """The functions a support cell holds; None for any other cell."""
  match = _HEADER_RE.match(cell.lstrip("\ufeff"))
  return tuple(n.strip() for n in match.group(1).split(",")) if match else None


def _used_now(stmt: ast.stmt) -> set[str]:
  """Names a statement reads when it runs (a def's decorators and defaults, not its body)."""
  if isinstance(stmt, ast.FunctionDef):
    parts: list[ast.AST] = [*stmt.decorator_list, *stmt.args.defaults,
                            *(d for d in stmt.args.kw_defaults if d is not None)]
    return set().union(*(support_module.used(p) for p in parts)) if parts else set()
  return support_module.used(stmt)


def source(names: tuple[str, ...], before: set[str], through: set[str]) -> str:
  """The cell's text: ``names`` and what they use, in the support module's order, and
  the imports they need, except those the notebook makes (import statements as written):
  ``before`` the cell, or, for modules only the functions' bodies read, in the cells
  ``through`` the first converted one (the bodies run when the converted code calls
  them; importing such a module twice would be an unused import redefined, F811)."""
  statements = support_module.statements()
  kept = support_module.needed(names)
  used = set().union(*(support_module.used(s) for s, _ in kept))
  used_now = set().union(*(_used_now(s) for s, _ in kept))
  heads = [t for s, t in statements if isinstance(s, (ast.Import, ast.ImportFrom))
           and support_module.defined(s) & used and t.strip() not in before
           and (support_module.defined(s) & used_now or t.strip() not in through)]
  header = _HEADER.format(names=", ".join(sorted(names)))
  parts = ["".join(heads)] if heads else []
  parts += [t.strip("\n") for _, t in kept]
  return header + "\n\n\n".join(p.rstrip("\n") for p in parts) + "\n"


def top_level_imports(code: str) -> set[str]:
  """The notebook's top-level import statements, as written (one per line)."""
  try:
    tree = ast.parse(code)
  except SyntaxError:
    return set()
  lines = code.splitlines()
  return {lines[s.lineno - 1].strip() for s in tree.body
          if isinstance(s, (ast.Import, ast.ImportFrom)) and s.lineno == s.end_lineno}


_CELL_MARK = re.compile(r"^# pmap-to-shmap:cell (\d+)$")


def first_cell_using(new_source: str, names: tuple[str, ...]) -> int | None:
  """The first code cell (number) whose new code calls one of ``names``."""
  use = re.compile(rf"(?<![\w.])(?:{'|'.join(map(re.escape, names))})\b")
  cell = 0
  for line in new_source.split("\n"):
    mark = _CELL_MARK.match(line)
    if mark:
      cell = int(mark.group(1))
    elif use.search(line) and not line.lstrip().startswith("#"):
      return cell
  return None


_OPENER = re.compile(r"^(`{3,}|~{3,})")


def insert_markdown_cell(text: str, code: notebook.CellCode, before: int, cell: str) -> str:
  """The markdown notebook with a code cell holding ``cell`` before code cell ``before``,
  opened by the same fence line (and kernel) as that cell."""
  lines = text.splitlines(keepends=True)
  start = code.spans[before][0]
  opener = next(i for i in range(start - 1, -1, -1) if _OPENER.match(lines[i]))
  fence = _OPENER.match(lines[opener])
  assert fence is not None
  newline = code.newline
  block = (lines[opener].rstrip("\r\n") + newline + cell.replace("\n", newline)
           + fence.group(1) + newline + newline)
  return "".join(lines[:opener]) + block + "".join(lines[opener:])


def _cell_start(source: str, cell: int) -> int:
  """Where code cell ``cell``'s marker line starts in the joined source."""
  match = re.search(rf"^# pmap-to-shmap:cell {cell}$", source, re.M)
  return match.start() if match else len(source)


def placed(names: tuple[str, ...], cells: list[str],
           new_source: str) -> tuple[str, tuple[int, str] | None]:
  """The support code for ``names``: (the joined new source with an existing support cell
  grown to hold them, or as it was; (code cell number, text) of a new cell to insert
  before that cell, or None)."""
  # A cell holds every flag's code (``support_module.statements``): the names it lists
  # are functions.
  names = tuple(name for name in names if name not in support_module.FEATURES)
  if not names:
    return new_source, None
  existing = next(((i, have) for i, cell in enumerate(cells)
                   if (have := names_in(cell)) is not None), None)
  if existing is not None:
    number, have = existing
    if set(names) <= set(have):
      return new_source, None
    start = _cell_start(new_source, number)
    end = _cell_start(new_source, number + 1)
    marker = new_source[start:new_source.index("\n", start) + 1]
    cell = source(tuple(sorted(set(have) | set(names))), top_level_imports(new_source[:start]),
                  top_level_imports(new_source))
    return new_source[:start] + marker + cell + new_source[end:], None
  before = first_cell_using(new_source, names)
  if before is None:
    raise RuntimeError("converted sites call support functions no code cell uses")
  start, end = _cell_start(new_source, before), _cell_start(new_source, before + 1)
  return new_source, (before, source(names, top_level_imports(new_source[:start]),
                                     top_level_imports(new_source[:end])))


def with_cell(new_source: str, new_cell: tuple[int, str] | None) -> str:
  """The joined source with the new cell shown before its cell (for the diff)."""
  if new_cell is None:
    return new_source
  at = _cell_start(new_source, new_cell[0])
  return new_source[:at] + new_cell[1] + new_source[at:]


def support_cell(cells: list[str]) -> int | None:
  """The number of the code cell holding the support code, if there is one."""
  return next((i for i, cell in enumerate(cells) if names_in(cell) is not None), None)


def masked(source: str, cells: Collection[int]) -> str:
  """The joined source with ``cells``' lines blanked to comments (same line count, so
  positions in other cells hold): the codemod neither reads nor edits them."""
  for cell in cells:
    start, end = _cell_start(source, cell), _cell_start(source, cell + 1)
    body_start = source.index("\n", start) + 1
    blank = "".join("#\n" for _ in source[body_start:end].splitlines())
    source = source[:body_start] + blank + source[end:]
  return source


def unmasked(new_source: str, source: str, cells: Collection[int]) -> str:
  """``new_source`` (from ``masked(source, cells)``) with those cells' text put back."""
  for cell in cells:
    start, end = _cell_start(source, cell), _cell_start(source, cell + 1)
    new_start, new_end = _cell_start(new_source, cell), _cell_start(new_source, cell + 1)
    new_source = new_source[:new_start] + source[start:end] + new_source[new_end:]
  return new_source

