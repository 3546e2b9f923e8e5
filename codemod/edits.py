"""Source-level formatting of the code the rewrite puts at a site.

Generated calls fill their lines up to WIDTH and continue aligned after the
parenthesis they belong to, with their full indentation wherever they are inserted; an argument copied from the
old site that spans lines is shifted with its new start, so its continuation lines
keep their indentation relative to it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import libcst as cst

WIDTH = 88
HANG = "    "
_HANG_AFTER = 48  # columns: an opening parenthesis further right gets hanging lines


@dataclass(frozen=True)
class Call:
  """A call to render: ``func(args...)``; ``func`` and the args may be calls themselves."""
  func: str | Call
  args: tuple[str | Call, ...]


def render(call: Call, column: int, indent: int = 0) -> str:
  """``call`` as source starting at ``column`` on a line indented by ``indent``: arguments
  fill each line up to WIDTH and continue aligned after their opening parenthesis, or
  (when that is far right) on hanging lines indented one step more than the statement."""
  head = call.func if isinstance(call.func, str) else render(call.func, column, indent)
  open_col = _end_column(head, column) + 1
  flat = head + "(" + ", ".join(a if isinstance(a, str) else render(a, WIDTH, indent)
                                 for a in call.args) + ")"
  if "\n" not in flat and _end_column(flat, column) <= WIDTH:
    return flat
  out = head + "("
  first = call.args[0] if call.args else ""
  first_text = first if isinstance(first, str) else render(first, open_col, indent)
  first_hangs = first_text.split("\n", 1)[0].endswith("(")
  if first_hangs or open_col > _HANG_AFTER and (_end_column(first_text, open_col) + 1 > WIDTH
                                                or len(call.args) > 1):
    open_col = indent + len(HANG)
    out += "\n" + " " * open_col
  at = open_col
  for i, arg in enumerate(call.args):
    sep = ", " if i else ""
    text = arg if isinstance(arg, str) else render(arg, at + len(sep), indent)
    if i and _end_column(sep + text, at) + 1 > WIDTH:  # + 1: the "," or ")" after it
      out += ",\n" + " " * open_col
      at, sep = open_col, ""
      text = arg if isinstance(arg, str) else render(arg, at, indent)
    out += sep + text
    at = _end_column(sep + text, at)
  return out + ")"


def _end_column(text: str, column: int) -> int:
  """The column just after ``text`` when it starts at ``column``."""
  last_newline = text.rfind("\n")
  return column + len(text) if last_newline < 0 else len(text) - last_newline - 1


def place_argument(text: str, stand_in: str, code: str, old_column: int,
                   start_column: int) -> str:
  """``text`` (starting at ``start_column``) with ``stand_in`` replaced by ``code``, which
  started at ``old_column`` in the old source."""
  at = text.index(stand_in)
  line_start = text.rfind("\n", 0, at) + 1
  new_column = at - line_start if line_start else start_column + at
  if "\n" in code and '"""' not in code and "'''" not in code:
    code = _shift(code, new_column - old_column)
  return text[:at] + code + text[at + len(stand_in):]


def _shift(code: str, delta: int) -> str:
  """Moves every line after the first ``delta`` columns (right if positive)."""
  first, *rest = code.split("\n")
  moved = []
  for line in rest:
    if delta >= 0:
      moved.append(" " * delta + line if line.strip() else line)
    else:
      strip = min(-delta, len(line) - len(line.lstrip(" ")))
      moved.append(line[strip:])
  return "\n".join([first, *moved])


class _AbsoluteIndent(cst.CSTTransformer):
  """Continuation lines carry their full indentation, not the enclosing block's on top."""

  def leave_ParenthesizedWhitespace(self, original_node, updated_node):
    return updated_node.with_changes(indent=False)


def parse_expression(text: str) -> cst.BaseExpression:
  return cast(cst.BaseExpression, cst.parse_expression(text).visit(_AbsoluteIndent()))
