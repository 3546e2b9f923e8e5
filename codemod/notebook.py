"""``.ipynb`` support: the code cells, as one module the codemod can read, and back.

Cells are joined with marker comments so names imported in one cell resolve in the
next (as they do in the kernel); IPython magics and shell lines (``%...``, ``!...``)
are masked as comments while the module is parsed, and restored afterwards.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

_CELL = "# pmap-to-shmap:cell {}\n"
_CELL_RE = re.compile(r"^# pmap-to-shmap:cell (\d+)\n", re.M)
_MAGIC = "# pmap-to-shmap:magic {}"
_MAGIC_RE = re.compile(r"^# pmap-to-shmap:magic (\d+)$", re.M)


@dataclass
class NotebookCode:
  notebook: dict
  code_cells: list[int]          # indices of the code cells in notebook["cells"]
  magics: list[str]
  source: str                    # the joined, masked code
  line_starts: list[int]         # first line of each code cell in `source` (1-based)


def _cell_text(cell: dict) -> str:
  src = cell.get("source", "")
  return "".join(src) if isinstance(src, list) else src


def read_notebook(raw: bytes) -> NotebookCode:
  notebook = json.loads(raw.decode("utf-8"))
  code_cells = [i for i, c in enumerate(notebook.get("cells", []))
                if c.get("cell_type") == "code"]
  magics: list[str] = []
  parts, starts, line = [], [], 1
  for n, index in enumerate(code_cells):
    lines = []
    for text in _cell_text(notebook["cells"][index]).splitlines():
      if text.lstrip().startswith(("%", "!")) or text.rstrip().endswith("?"):
        lines.append(_MAGIC.format(len(magics)))
        magics.append(text)
      else:
        lines.append(text)
    body = "".join(l + "\n" for l in lines)
    parts.append(_CELL.format(n) + body)
    starts.append(line + 1)
    line += 1 + len(lines)
  return NotebookCode(notebook, code_cells, magics, "".join(parts), starts)


def cell_of(code: NotebookCode, line: int) -> tuple[int, int]:
  """(cell number among code cells, line within it) for a line of the joined source."""
  cell = 0
  for n, start in enumerate(code.line_starts):
    if line >= start:
      cell = n
  return cell, line - code.line_starts[cell] + 1 if code.line_starts else line


def write_notebook(code: NotebookCode, new_source: str) -> bytes | None:
  """The notebook with its code cells replaced by ``new_source``'s; None if unchanged."""
  restored = _MAGIC_RE.sub(lambda m: code.magics[int(m.group(1))], new_source)
  pieces = _CELL_RE.split(restored)
  prefix, numbered = pieces[0], pieces[1:]
  texts = {int(numbered[i]): numbered[i + 1] for i in range(0, len(numbered), 2)}
  if prefix and texts:
    first = min(texts)
    texts[first] = prefix + texts[first]
  changed = False
  for n, index in enumerate(code.code_cells):
    cell = code.notebook["cells"][index]
    old = _cell_text(cell)
    new = texts.get(n, "")
    if not old.endswith("\n") and new.endswith("\n"):
      new = new[:-1]
    if new == old:
      continue
    changed = True
    cell["source"] = new.splitlines(keepends=True) if isinstance(cell.get("source"), list) else new
  if not changed:
    return None
  return (json.dumps(code.notebook, indent=1, ensure_ascii=False) + "\n").encode("utf-8")
