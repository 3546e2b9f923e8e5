"""Notebooks: ``.ipynb`` code cells (nbformat 4, and nbformat 3's worksheets), and MyST /
jupytext ``.md`` code cells, as one module the codemod can read, and back.

Cells are joined with marker comments so names imported in one cell resolve in the
next (as they do in the kernel). IPython syntax (magics, shell escapes, help queries;
``ipython_syntax`` finds it where IPython does) is masked by Python of as many lines
while the module is parsed, and restored verbatim afterwards. Each cell is parsed with
``\\n`` line endings; a cell the codemod leaves alone is written back untouched, and a
changed one keeps its unchanged lines' endings and gives new lines the cell's own. An
``.ipynb`` is written back with the JSON layout it was read with (indent, key order,
escaping, line endings, trailing newline), so only the changed cells differ.
"""
from __future__ import annotations

import ast
import difflib
import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from codemod import ipython_syntax
from codemod.findings import Finding

_CELL = "# pmap-to-shmap:cell {}\n"
_CELL_RE = re.compile(r"^# pmap-to-shmap:cell (\d+)\n", re.M)
_MASK = "_pmap_to_shmap_magic_"
_MASK_RE = re.compile(rf"^.*\b{_MASK}\((\d+)\)[ \t]*\n|^#{_MASK} \d+\n", re.M)
# A line and its ending, as Python reads source: \r\n, \r or \n (not \f, \v, \u2028...).
_LINE_RE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")
_ENDING_RE = re.compile(r"(?:\r\n|\r|\n)\Z")


@dataclass
class CellCode:
  cells: list[str]               # each code cell's text, as read (its own line endings)
  magics: list[str]              # the IPython syntax masked in `source`, by number
  source: str                    # the joined, masked code, with \n line endings
  line_starts: list[int]         # first line of each code cell in `source` (1-based)
  newline: str = "\n"            # the most common line ending in the cells
  cell_magics: list[tuple[str, bool] | None] = field(default_factory=list)  # (line, opaque)
  notebook: Any = None           # .ipynb: the parsed JSON
  sources: list[tuple[dict, str]] = field(default_factory=list)  # .ipynb: (cell, source key)
  lines: list[str] = field(default_factory=list)       # .md: the file's lines
  spans: list[tuple[int, int]] = field(default_factory=list)  # .md: each cell's line range
  first_lines: list[int] = field(default_factory=list)  # .md: line before each cell's code
  labels: list[str] = field(default_factory=list)  # .ipynb: "cell N" among all the cells


def _lines(text: str) -> list[str]:
  return _LINE_RE.findall(text)


def _ending(line: str) -> str:
  match = _ENDING_RE.search(line)
  return match.group(0) if match else ""


def _normal(text: str) -> str:
  """``text`` with \\n line endings."""
  return "".join(_ENDING_RE.sub("\n", line) for line in _lines(text))


def _cell_code(cells: list[str], **where: Any) -> CellCode:
  magics: list[str] = []
  parts, starts, line = [], [], 1
  cell_magics: list[tuple[str, bool] | None] = []
  bound: set[str] = set()  # names the cells so far define: they shadow automagics
  for n, cell in enumerate(cells):
    lines = [_ENDING_RE.sub("", l) + "\n" for l in _lines(cell)]
    magic_line = ipython_syntax.cell_magic(lines)
    cell_magics.append(None if magic_line is None else (
        lines[magic_line[0]], magic_line[1] not in ipython_syntax.PYTHON_BODY_CELL_MAGICS))
    for magic in ipython_syntax.magics(lines, frozenset(bound)):
      number = len(magics)
      magics.append("".join(lines[magic.start:magic.stop]))
      # A comment where the syntax fills its lines (a statement could move where the
      # codemod adds imports); a statement where Python needs one (a block's body, or the
      # value of an assignment).
      first = f"{_MASK}({number})" if magic.prefix else f"#{_MASK}({number})"
      lines = ipython_syntax.masked(lines, magic, first, f"#{_MASK} {number}")
    bound |= _bound_names("".join(lines))
    parts.append(_CELL.format(n) + "".join(lines))
    starts.append(line + 1)
    line += 1 + len(lines)
  endings = Counter(e for cell in cells for l in _lines(cell) if (e := _ending(l)))
  newline = endings.most_common(1)[0][0] if endings else "\n"
  return CellCode(cells, magics, "".join(parts), starts, newline, cell_magics, **where)


def _bound_names(code: str) -> set[str]:
  """The names a cell binds (imports, assignments, defs, loop targets, ...), anywhere."""
  try:
    tree = ast.parse(code)
  except (SyntaxError, ValueError):
    return set()
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
      names.add(node.id)
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names.add(node.name)
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names.update((a.asname or a.name).split(".")[0] for a in node.names)
  return names


def code_cells(source: str) -> list[str]:
  """The joined source's code cells, each as Jupyter parses it: alone."""
  return _CELL_RE.split(source)[2::2]


def _split(code: CellCode, new_source: str) -> list[str]:
  """Each cell's new text, with \\n line endings (ending in one only where the old text
  did)."""
  restored = _MASK_RE.sub(lambda m: code.magics[int(m.group(1))] if m.group(1) else "",
                          new_source)
  pieces = _CELL_RE.split(restored)
  prefix, numbered = pieces[0], pieces[1:]
  texts = {int(numbered[i]): numbered[i + 1] for i in range(0, len(numbered), 2)}
  if prefix and texts:
    first = min(texts)
    texts[first] = prefix + texts[first]
  out = []
  for n, old in enumerate(code.cells):
    new = texts.get(n, "")
    if not _ending(old) and new.endswith("\n"):
      new = new[:-1]
    out.append(new)
  return out


def _with_endings(old: str, new: str, newline: str) -> str:
  """``new`` (\\n endings) as the cell's text: unchanged lines keep their endings, new ones
  get the cell's usual one (``newline`` in a cell that has none)."""
  old_lines = _lines(old)
  endings = Counter(e for l in old_lines if (e := _ending(l)))
  usual = endings.most_common(1)[0][0] if endings else newline
  old_normal, new_lines = [_normal(l) for l in old_lines], _lines(new)
  out: list[str] = []
  matcher = difflib.SequenceMatcher(None, old_normal, new_lines, autojunk=False)
  for tag, i1, i2, j1, j2 in matcher.get_opcodes():
    if tag == "equal":
      out.extend(old_lines[i1:i2])
    else:
      out.extend(_ENDING_RE.sub(usual, l) for l in new_lines[j1:j2])
  return "".join(out)


def _new_cells(code: CellCode, new_source: str) -> list[str | None]:
  """Each cell's new text with its line endings, None where it is unchanged."""
  texts = _split(code, new_source)
  for old, new, cell_magic in zip(code.cells, texts, code.cell_magics, strict=True):
    # IPython reads a cell magic on the first line only, and a body that is not Python
    # must not change: refuse (an internal error) rather than write a broken cell.
    if cell_magic is not None and (
        next((l + "\n" for l in new.split("\n") if l.strip()), "") != cell_magic[0]
        or cell_magic[1] and new != _normal(old)):
      raise RuntimeError(f"the conversion moved code into a {cell_magic[0].strip()} cell")
  return [None if new == _normal(old) else _with_endings(old, new, code.newline)
          for old, new in zip(code.cells, texts, strict=True)]


_MASK_NUMBER_RE = re.compile(rf"\b{_MASK}\((\d+)\)")


def hidden_lines(code: CellCode, wanted: Callable[[str], bool]) -> list[int]:
  """Lines of ``code.source`` that stand for IPython syntax ``wanted`` picks: code the
  codemod does not see, so cannot convert."""
  found = []
  for number, line in enumerate(code.source.split("\n"), 1):
    mask = _MASK_NUMBER_RE.search(line)
    if mask and wanted(code.magics[int(mask.group(1))]):
      found.append(number)
  return found


def cell_of(code: CellCode, line: int) -> tuple[int, int]:
  """(cell number among code cells, line within it) for a line of the joined source; a
  line before the first cell's code (the joined source's own first line) is its line 1."""
  cell = 0
  for n, start in enumerate(code.line_starts):
    if line >= start:
      cell = n
  return cell, max(1, line - code.line_starts[cell] + 1) if code.line_starts else line


def in_cells(code: CellCode, findings: list[Finding]) -> list[Finding]:
  """Findings on lines of the joined source, placed where the user sees them: a .ipynb's
  ``cell N, line L`` (N counting every cell, as Jupyter shows them), a markdown file's own
  line in its ``code cell N``."""
  out = []
  for f in findings:
    cell, line = cell_of(code, f.line)
    if code.first_lines:
      out.append(Finding(code.first_lines[cell] + line, f.column, f.severity,
                         f"code cell {cell + 1}: {f.message}"))
    else:
      label = code.labels[cell] if code.labels else f"cell {cell + 1}"
      out.append(Finding(line, f.column, f.severity, f"{label}, line {line}: {f.message}"))
  return out


# ----- .ipynb -----

_JSON_KINDS = {dict: "an object", list: "an array", str: "a string", int: "a number",
               float: "a number", bool: "a boolean", type(None): "null"}


def _kind(value: Any) -> str:
  return _JSON_KINDS.get(type(value), type(value).__name__)


def _python_sources(notebook: Any) -> list[tuple[dict, str, str]]:
  """(cell, key of its source, where it is: "cell N" counting every cell as Jupyter shows
  them) for each Python code cell; ValueError naming what is wrong
  when the notebook's structure is not one nbformat 3 or 4 defines."""
  if not isinstance(notebook, dict):
    raise ValueError(f"the top level is {_kind(notebook)}, expected an object with a "
                     "'cells' list")
  if "worksheets" in notebook:  # nbformat 3: cells in worksheets, code in "input"
    worksheets = notebook["worksheets"]
    if not isinstance(worksheets, list):
      raise ValueError(f"'worksheets' is {_kind(worksheets)}, expected an array")
    cells: list[tuple[str, Any]] = []
    key = "input"
    for w, sheet in enumerate(worksheets, 1):
      if not isinstance(sheet, dict) or not isinstance(sheet.get("cells", []), list):
        raise ValueError(f"worksheet {w} is not an object with a 'cells' array")
      cells.extend((f"worksheet {w}, cell {c}", cell)
                   for c, cell in enumerate(sheet.get("cells", []), 1))
  elif isinstance(notebook.get("cells"), list):
    cells, key = [(f"cell {c}", cell) for c, cell in enumerate(notebook["cells"], 1)], "source"
  else:
    found = "no 'cells'" if "cells" not in notebook else f"'cells' is {_kind(notebook['cells'])}"
    raise ValueError(f"{found}, expected an array of cells (or nbformat 3 'worksheets')")
  python = _is_python(_language(notebook))
  sources = []
  for where, cell in cells:
    if not isinstance(cell, dict):
      raise ValueError(f"{where} is {_kind(cell)}, expected an object")
    if not isinstance(cell.get("cell_type"), str):
      raise ValueError(f"{where} has no 'cell_type' string")
    if cell["cell_type"] != "code":
      continue
    source = cell.get(key)
    if not (isinstance(source, str)
            or isinstance(source, list) and all(isinstance(s, str) for s in source)):
      found = f"no '{key}'" if key not in cell else f"'{key}' is {_kind(source)}"
      raise ValueError(f"{where}: {found}, expected a string or an array of strings")
    if python and _is_python(cell.get("language")):
      sources.append((cell, key, where))
  return sources


def _is_python(language: Any) -> bool:
  """Whether a kernel or cell language (None: not stated) is Python's."""
  return language is None or isinstance(language, str) and language.lower().startswith(
      ("python", "ipython"))


def _language(notebook: dict) -> str | None:
  """The kernel's language, where the metadata says (a Julia notebook's pmap is not JAX's)."""
  metadata = notebook.get("metadata")
  if not isinstance(metadata, dict):
    return None
  for section, key in (("language_info", "name"), ("kernelspec", "language")):
    value = metadata.get(section)
    if isinstance(value, dict) and isinstance(value.get(key), str):
      return value[key]
  return None


def _cell_text(cell: dict, key: str) -> str:
  source = cell[key]
  return "".join(source) if isinstance(source, list) else source


def read_notebook(raw: bytes) -> CellCode:
  """The notebook's Python code cells; ValueError saying why for a file that is not a
  notebook (not UTF-8, not JSON, or not shaped as nbformat 3 or 4 says)."""
  try:
    text = raw.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    raise ValueError(f"not UTF-8 ({e})") from e
  try:
    notebook = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"not JSON ({e})") from e
  sources = _python_sources(notebook)
  return _cell_code([_cell_text(cell, key) for cell, key, _ in sources], notebook=notebook,
                    sources=[(cell, key) for cell, key, _ in sources],
                    labels=[where for _, _, where in sources])


@dataclass(frozen=True)
class _Layout:
  indent: str | None
  ensure_ascii: bool
  separators: tuple[str, str]

  def dumps(self, value: Any) -> str:
    return json.dumps(value, indent=self.indent, ensure_ascii=self.ensure_ascii,
                      separators=self.separators)


_NBFORMAT_LAYOUT = _Layout(" ", False, (",", ": "))


def _json_layout(text: str, notebook: Any) -> _Layout:
  """The json.dumps layout that gives ``text`` (with \\n line endings, without its trailing
  newline) from ``notebook``; nbformat's own if none does."""
  indent_match = re.search(r"\n([ \t]*)\S", text)  # "" for json.dumps(indent=0)
  indent = indent_match.group(1) if indent_match else None
  separators = [(",", ": "), (", ", ": ")] if indent is not None else [(", ", ": "), (",", ":")]
  for ensure_ascii in (False, True):
    for separator in separators:
      layout = _Layout(indent, ensure_ascii, separator)
      if layout.dumps(notebook) == text:
        return layout
  return _NBFORMAT_LAYOUT


def write_notebook(code: CellCode, new_source: str, raw: bytes,
                   new_cell: tuple[int, str] | None = None) -> bytes | None:
  """The notebook with its code cells replaced by ``new_source``'s, and ``new_cell``
  (before code cell number, text) inserted; None if unchanged."""
  new_cells = _new_cells(code, new_source)
  if all(new is None for new in new_cells) and new_cell is None:
    return None
  bom = raw.startswith(b"\xef\xbb\xbf")
  text = raw.decode("utf-8-sig")
  body = text.rstrip("\r\n")
  newline = "\r\n" if "\r\n" in body else "\n"  # raw line breaks in JSON are layout only
  layout = _json_layout(body.replace("\r\n", "\n"), code.notebook)  # before the changes
  for (cell, key), new in zip(code.sources, new_cells, strict=True):
    if new is not None:
      cell[key] = _lines(new) if isinstance(cell[key], list) else new
  if new_cell is not None:
    _insert_cell(code, *new_cell)
  out = layout.dumps(code.notebook).replace("\n", newline) + text[len(body):]
  return ("\ufeff" if bom else "").encode("utf-8") + out.encode("utf-8")


def _insert_cell(code: CellCode, before: int, text: str) -> None:
  """Inserts a code cell holding ``text`` into ``code.notebook`` before code cell
  ``before``, shaped like that cell (nbformat 3 or 4, source as a list or a string)."""
  target, key = code.sources[before]
  # As Jupyter saves a cell: no line break after its last line.
  lines = text.rstrip("\n").replace("\n", code.newline).splitlines(keepends=True)
  new: dict = {"cell_type": "code"}
  if key == "input":  # nbformat 3
    new.update(collapsed=False, input=lines if isinstance(target[key], list) else "".join(lines),
               language="python", metadata={}, outputs=[])
  else:
    new.update(execution_count=None, metadata={}, outputs=[],
               source=lines if isinstance(target[key], list) else "".join(lines))
    if "id" in target:
      new["id"] = "pmap-to-shmap-support"
  sheets = ([code.notebook["cells"]] if "cells" in code.notebook
            else [w["cells"] for w in code.notebook["worksheets"]])
  for cells in sheets:
    for i, cell in enumerate(cells):
      if cell is target:
        cells.insert(i, {k: new[k] for k in sorted(new)} if _sorted(target) else new)
        return
  raise RuntimeError("the notebook cell to insert support code before was not found")


def _sorted(cell: dict) -> bool:
  keys = list(cell)
  return keys == sorted(keys)


# ----- MyST / jupytext markdown -----

_MYST_OPEN = re.compile(r"^(`{3,}|~{3,})\{code-cell\}[ \t]*([^\s`~]*)")  # fence, kernel
_JUPYTEXT_OPEN = re.compile(r"^(`{3,})(?:python|ipython3?)\s*$")


def read_markdown(text: str) -> CellCode | None:
  """The code cells of a MyST (```{code-cell}) or jupytext markdown notebook; None for
  other markdown."""
  lines = _lines(text)
  myst = any(_MYST_OPEN.match(l) for l in lines)
  if not myst and not (text.startswith("---") and "jupytext" in text.split("\n---", 1)[0]):
    return None
  opener = _MYST_OPEN if myst else _JUPYTEXT_OPEN
  spans, i = [], 0
  while i < len(lines):
    match = opener.match(lines[i])
    if not match:
      i += 1
      continue
    fence = match.group(1)
    start = i + 1
    if myst and start < len(lines) and lines[start].strip() == "---":  # a YAML options block
      start = next((k + 1 for k in range(start + 1, len(lines)) if lines[k].strip() == "---"),
                   start)
    while myst and start < len(lines) and lines[start].startswith(":"):  # :tag: options
      start += 1
    end = next((k for k in range(start, len(lines)) if lines[k].rstrip() == fence), len(lines))
    if not myst or _is_python(match.group(2) or None):  # not another kernel's cell
      spans.append((start, end))
    i = end + 1
  return _cell_code(["".join(lines[a:b]) for a, b in spans], lines=lines, spans=spans,
                    first_lines=[a for a, _ in spans])


def write_markdown(code: CellCode, new_source: str) -> str | None:
  """The markdown with its code cells replaced by ``new_source``'s; None if unchanged."""
  new_cells = _new_cells(code, new_source)
  if all(new is None for new in new_cells):
    return None
  lines = list(code.lines)
  for (start, end), new in reversed(list(zip(code.spans, new_cells, strict=True))):
    if new is not None:
      lines[start:end] = [new] if new else []
  return "".join(lines)
