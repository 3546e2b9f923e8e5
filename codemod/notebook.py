"""Notebooks: ``.ipynb`` code cells, and MyST / jupytext ``.md`` code cells, as one module
the codemod can read, and back.

Cells are joined with marker comments so names imported in one cell resolve in the
next (as they do in the kernel); IPython magics and shell lines (``%...``, ``!...``)
are masked as comments while the module is parsed, and restored afterwards. An
``.ipynb`` is written back with the JSON layout it was read with (indent, key order,
escaping, trailing newline), so only the changed cells differ.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_CELL = "# pmap-to-shmap:cell {}\n"
_CELL_RE = re.compile(r"^# pmap-to-shmap:cell (\d+)\n", re.M)
_MAGIC = "# pmap-to-shmap:magic {}"
_MAGIC_RE = re.compile(r"^# pmap-to-shmap:magic (\d+)$", re.M)


@dataclass
class CellCode:
  cells: list[str]               # each code cell's text
  magics: list[str]
  source: str                    # the joined, masked code
  line_starts: list[int]         # first line of each code cell in `source` (1-based)
  notebook: dict = field(default_factory=dict)   # .ipynb: the parsed JSON
  code_cells: list[int] = field(default_factory=list)  # .ipynb: indices in notebook["cells"]
  lines: list[str] = field(default_factory=list)       # .md: the file's lines
  spans: list[tuple[int, int]] = field(default_factory=list)  # .md: each cell's line range
  first_lines: list[int] = field(default_factory=list)  # .md: line before each cell's code


def _join(cells: list[str]) -> tuple[list[str], str, list[int]]:
  magics: list[str] = []
  parts, starts, line = [], [], 1
  for n, cell in enumerate(cells):
    lines = []
    for text in cell.splitlines():
      if text.lstrip().startswith(("%", "!")) or text.rstrip().endswith("?"):
        lines.append(_MAGIC.format(len(magics)))
        magics.append(text)
      else:
        lines.append(text)
    parts.append(_CELL.format(n) + "".join(l + "\n" for l in lines))
    starts.append(line + 1)
    line += 1 + len(lines)
  return magics, "".join(parts), starts


def _split(code: CellCode, new_source: str) -> list[str]:
  """Each cell's new text (ending in a newline only where the old one did)."""
  restored = _MAGIC_RE.sub(lambda m: code.magics[int(m.group(1))], new_source)
  pieces = _CELL_RE.split(restored)
  prefix, numbered = pieces[0], pieces[1:]
  texts = {int(numbered[i]): numbered[i + 1] for i in range(0, len(numbered), 2)}
  if prefix and texts:
    first = min(texts)
    texts[first] = prefix + texts[first]
  out = []
  for n, old in enumerate(code.cells):
    new = texts.get(n, "")
    if not old.endswith("\n") and new.endswith("\n"):
      new = new[:-1]
    out.append(new)
  return out


def cell_of(code: CellCode, line: int) -> tuple[int, int]:
  """(cell number among code cells, line within it) for a line of the joined source."""
  cell = 0
  for n, start in enumerate(code.line_starts):
    if line >= start:
      cell = n
  return cell, line - code.line_starts[cell] + 1 if code.line_starts else line


# ----- .ipynb -----

def _cell_text(cell: dict) -> str:
  src = cell.get("source", "")
  return "".join(src) if isinstance(src, list) else src


def read_notebook(raw: bytes) -> CellCode:
  notebook = json.loads(raw.decode("utf-8"))
  code_cells = [i for i, c in enumerate(notebook.get("cells", []))
                if c.get("cell_type") == "code"]
  cells = [_cell_text(notebook["cells"][i]) for i in code_cells]
  magics, source, starts = _join(cells)
  return CellCode(cells, magics, source, starts, notebook=notebook, code_cells=code_cells)


def _json_layout(raw: bytes) -> dict:
  """json.dumps arguments that reproduce the file's layout."""
  text = raw.decode("utf-8")
  indent_match = re.search(r"\n([ \t]+)\S", text)
  ascii_only = all(ord(ch) < 128 for ch in text)
  return {"indent": indent_match.group(1) if indent_match else None,
          "ensure_ascii": ascii_only and "\\u" in text,
          "separators": (",", ": ") if indent_match else None}


def write_notebook(code: CellCode, new_source: str, raw: bytes) -> bytes | None:
  """The notebook with its code cells replaced by ``new_source``'s; None if unchanged."""
  changed = False
  for index, old, new in zip(code.code_cells, code.cells, _split(code, new_source), strict=True):
    if new == old:
      continue
    changed = True
    cell = code.notebook["cells"][index]
    cell["source"] = new.splitlines(keepends=True) if isinstance(cell.get("source"), list) else new
  if not changed:
    return None
  text = json.dumps(code.notebook, **_json_layout(raw))
  newline = raw[len(raw.rstrip(b"\r\n")):].decode("utf-8")
  return (text + newline).encode("utf-8")


# ----- MyST / jupytext markdown -----

_MYST_OPEN = re.compile(r"^(`{3,}|~{3,})\{code-cell\}")
_JUPYTEXT_OPEN = re.compile(r"^(`{3,})(?:python|ipython3?)\s*$")


def read_markdown(text: str) -> CellCode | None:
  """The code cells of a MyST (```{code-cell}) or jupytext markdown notebook; None for
  other markdown."""
  lines = text.splitlines(keepends=True)
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
    spans.append((start, end))
    i = end + 1
  cells = ["".join(lines[a:b]) for a, b in spans]
  magics, source, starts = _join(cells)
  return CellCode(cells, magics, source, starts, lines=lines, spans=spans,
                  first_lines=[a for a, _ in spans])


def write_markdown(code: CellCode, new_source: str) -> str | None:
  """The markdown with its code cells replaced by ``new_source``'s; None if unchanged."""
  new_cells = _split(code, new_source)
  if new_cells == code.cells:
    return None
  lines = list(code.lines)
  for (start, end), new in reversed(list(zip(code.spans, new_cells, strict=True))):
    lines[start:end] = [new] if new else []
  return "".join(lines)
