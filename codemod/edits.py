"""Source-level formatting of the code the rewrite puts at a site.

A generated call is laid out the way the file's own code is (``file_style``): on one line
when it fits the file's limit; else its arguments fill lines aligned after the
parenthesis, or, when that is far right or does not fit, on hanging lines one
continuation indent deeper than the line the call starts on. An argument that breaks over
lines ends its line, so nested calls read as a hand-written tree, not a staircase. Code
copied from the old site (``Copied``) keeps the shape of its continuation lines: those
aligned inside it move with its first line, those hanging from the indentation of the
line it started on hang from the indentation of the line it starts on now; a one-line
copy that does not fit where it goes breaks at its calls' arguments. Comments the
user wrote at the site travel with the argument they described: a call carrying comments
is laid out one argument per line, each own-line comment before its argument and each
trailing comment after that argument's comma. A one-line statement that a renamed name
takes past the limit is broken as a formatter would (``arguments_broken``).
"""
from __future__ import annotations

import io
import tokenize
from dataclasses import dataclass, field
from typing import cast

import libcst as cst

from codemod.file_style import FileStyle

DEFAULT_STYLE = FileStyle(width=80, hang="    ", unit="    ", quote='"')
_ALIGN_LIMIT = 0.6  # an opening parenthesis right of this share of the width hangs instead


@dataclass(frozen=True)
class Copied:
  """Source text of the old site; its continuation lines sit at their old columns."""
  code: str
  column: int  # where its first line started in the old source


@dataclass(eq=False)
class Arg:
  """An argument with the comments the user wrote around what it replaces."""
  value: Value
  leading: list[str] = field(default_factory=list)   # own lines before it
  trailing: list[str] = field(default_factory=list)  # after it, on its line

  def commented(self) -> bool:
    return bool(self.leading or self.trailing)


@dataclass(eq=False)
class Call:
  """A call to render: ``func(args...)``; ``func`` and the args may be calls themselves."""
  func: str | Call
  args: tuple[Value | Arg, ...]
  head: list[str] = field(default_factory=list)  # comments after "("
  tail: list[str] = field(default_factory=list)  # own-line comments before ")"
  close_alone: bool = False  # one argument per line and ")" on its own (black's layout)

  def commented(self) -> bool:
    return bool(self.head or self.tail or self.close_alone) or any(
        isinstance(a, Arg) and a.commented() for a in self.args)


Value = str | Call | Copied


def render(value: Value | Arg, column: int, indent: int = 0,
           style: FileStyle = DEFAULT_STYLE, reserve: int = 0) -> str:
  """``value`` as source starting at ``column`` on a line indented by ``indent``, leaving
  ``reserve`` columns free after it on its last line (for the ``,`` or ``)`` that follows)."""
  return _Layout(style).value(value, column, indent, reserve)


class _Layout:

  def __init__(self, style: FileStyle):
    self.style = style
    self.width = style.width

  def value(self, value: Value | Arg, column: int, indent: int, reserve: int,
            hang_ok: bool = True) -> str:
    if isinstance(value, Arg):
      value = value.value
    if isinstance(value, str):
      return value
    if isinstance(value, Copied):
      moved = _moved(value, column, indent, len(self.style.hang))
      if "\n" in value.code or self.fits(moved, column, reserve):
        return moved
      # One line the old site held that does not fit here: a call in it breaks as
      # generated code does (only the spaces between its tokens change).
      tree = breakable(value.code)
      if isinstance(tree, Call):
        laid = self.call(tree, column, indent, reserve, hang_ok)
        if _overflow(laid, column, self.width, reserve) < _overflow(moved, column, self.width,
                                                                    reserve):
          return laid
      return moved
    return self.call(value, column, indent, reserve, hang_ok)

  def fits(self, text: str, column: int, reserve: int) -> bool:
    lines = text.split("\n")
    widths = [column + len(lines[0])] + [len(line) for line in lines[1:]]
    widths[-1] += reserve
    return max(widths) <= self.width

  def call(self, call: Call, column: int, indent: int, reserve: int,
           hang_ok: bool = True) -> str:
    """``call`` laid out; without ``hang_ok`` (inside arguments aligned after a parenthesis)
    its own arguments align too, so a hanging line never sits right of the text above."""
    if isinstance(call.func, str):
      head = call.func
    else:
      # A curried call: ``make(...)(f)`` keeps ``(f)`` on make's last line when it is short.
      args = self.flat_args(call)
      after = len(args) + 2 + reserve if args is not None and len(args) < 40 else 1
      head = self.call(call.func, column, indent, after, hang_ok)
    open_col = _end_column(head, column) + 1
    if call.commented():
      return head + self.vertical(call, indent)
    args = self.flat_args(call)
    if args is not None:
      flat = head + "(" + args + ")"
      if self.fits(flat, column, reserve):
        return flat
    candidates = []
    # ``make(...)(f)`` with a long or multi-line ``f``: f hangs under the line make starts on.
    curried_long = not isinstance(call.func, str) and args is None
    only = call.args[0] if len(call.args) == 1 else None
    inner = only.value if isinstance(only, Arg) else only
    if (hang_ok and isinstance(inner, Copied) and "\n" in inner.code
        and not call.commented() and not curried_long):
      # A lone copied argument opens on this line and its lines hang from this line's
      # indentation, as they hung from their old line's (``f(partial(\n    g, ...))``).
      candidates.append(head + "(" + self.value(inner, open_col, indent, reserve + 1) + ")")
    elif not hang_ok or open_col <= self.width * _ALIGN_LIMIT and not curried_long:
      candidates.append(head + "(" + self.fill(call.args, open_col, reserve, hang_ok=False))
    if hang_ok:
      hang = indent + len(self.style.hang)
      candidates.append(head + "(\n" + " " * hang + self.fill(call.args, hang, reserve))
    # The layout that fits, with the fewest lines pushed far right, in the fewest lines;
    # aligned (listed first) on a tie.
    deep = self.width * _ALIGN_LIMIT

    def key(t: str) -> tuple[int, int, int]:
      return (_overflow(t, column, self.width, reserve),
              sum(len(line) - len(line.lstrip(" ")) > deep for line in t.split("\n")[1:]),
              t.count("\n"))

    best = min(candidates, key=key)
    if (hang_ok and _overflow(best, column, self.width) and isinstance(inner, Call)
        and not call.commented()):
      # Nothing fits, whatever follows: a call's only argument, itself a call, may open
      # on this line, its own arguments hanging from this line's indent
      # (``jit(shard_map(\n    f, ...))``), where that fits.
      hugged = head + "(" + self.call(inner, open_col, indent, reserve + 1) + ")"
      if not key(hugged)[0]:
        return hugged
    return best

  def flat_args(self, call: Call) -> str | None:
    """The arguments on one line, or None when one of them cannot be."""
    parts = [_flat(arg.value if isinstance(arg, Arg) else arg) for arg in call.args]
    return None if any(p is None for p in parts) else ", ".join(cast(list[str], parts))

  def fill(self, args: tuple[Value | Arg, ...], start: int, reserve: int,
           hang_ok: bool = True) -> str:
    """The arguments from column ``start``, filling lines; a line breaks after an argument
    that spans lines, and before one that does not fit."""
    out = ""
    at = start
    broke_after = False
    for i, arg in enumerate(args):
      last = i == len(args) - 1
      after = 1 + (reserve if last else 0)  # the "," or ")" (and what follows the call)
      sep = ", " if i else ""
      text = self.value(arg, at + len(sep), start, after, hang_ok)
      if i and (broke_after or "\n" in text or not self.fits(sep + text, at, after)):
        sep = ",\n" + " " * start
        at = start
        text = self.value(arg, start, start, after, hang_ok)
        out += sep + text
      else:
        out += sep + text
      at = _end_column(text, at + (0 if "\n" in sep else len(sep)))
      broke_after = "\n" in text
    return out + ")"

  def vertical(self, call: Call, indent: int) -> str:
    """One argument per line, with the comments in place; ``)`` on its own line when a
    comment ends the last line."""
    inner = indent + len(self.style.hang)
    pad = " " * inner
    out = "("
    if call.head:
      out += "  " + "  ".join(call.head)
    args = [a if isinstance(a, Arg) else Arg(a) for a in call.args]
    own_line_close = (call.close_alone or bool(call.tail) or bool(args and args[-1].trailing)
                      or not args)
    for i, arg in enumerate(args):
      last = i == len(args) - 1
      trailing, extra = arg.trailing[:1], arg.trailing[1:]
      for comment in [*arg.leading, *extra]:
        out += "\n" + pad + comment
      comma = "," if not last or own_line_close else ""
      reserve = len(comma) if not last or own_line_close else 1
      out += "\n" + pad + self.value(arg.value, inner, inner, reserve) + comma
      if trailing:
        out += "  " + trailing[0]
    for comment in call.tail:
      out += "\n" + pad + comment
    return out + ("\n" + " " * indent + ")" if own_line_close else ")")


def _flat(value: Value) -> str | None:
  if isinstance(value, Call):
    if value.commented():
      return None
    func = value.func if isinstance(value.func, str) else _flat(value.func)
    args = [_flat(a.value if isinstance(a, Arg) else a) for a in value.args]
    if func is None or any(a is None for a in args):
      return None
    return func + "(" + ", ".join(cast(list[str], args)) + ")"
  text = value.code if isinstance(value, Copied) else value
  return None if "\n" in text else text


def _overflow(text: str, column: int, width: int, reserve: int = 0) -> int:
  lines = text.split("\n")
  widths = [column + len(lines[0])] + [len(x) for x in lines[1:]]
  widths[-1] += reserve
  return sum(max(0, w - width) for w in widths)


def _end_column(text: str, column: int) -> int:
  """The column just after ``text`` when it starts at ``column``."""
  last_newline = text.rfind("\n")
  return column + len(text) if last_newline < 0 else len(text) - last_newline - 1


def _moved(copied: Copied, column: int, indent: int, hang: int) -> str:
  """``copied`` starting at ``column`` on a line indented by ``indent``, its continuation
  lines moved to match: a line under a bracket its first line leaves open at the end hangs
  from that line's indentation, so it moves with the indentation (its first line may now
  start a line of its own, or follow other code); any other line moves with the text it is
  aligned to. The inside of a multi-line string stays as it is."""
  code = copied.code
  along = column - copied.column  # how far the first line's text moves
  if "\n" not in code or '"""' in code or "'''" in code:
    return code
  lines = code.split("\n")
  anchors = _anchors(code)
  hanging = [(_lead(lines[i]), a[2]) for i, a in anchors.items()
             if a is not None and a[:2] == (0, True)]
  # The old indentation the first line's brackets hang from: the code's own start when
  # the lines hanging from them sit right of it; else (the code followed other code on its
  # line) one continuation indent left of them, or, for closing brackets alone, theirs.
  opened = [lead for lead, closes in hanging if not closes]
  closed = [lead for lead, closes in hanging if closes]
  base = copied.column
  if opened and min(opened) <= copied.column:
    base = min(opened) - hang
  elif not opened and closed and min(closed) < copied.column:
    base = min(closed)
  deltas = [along] * len(lines)
  for i in range(1, len(lines)):
    anchor = anchors.get(i)
    if anchor is not None:
      line, hangs, _ = anchor
      deltas[i] = deltas[line] if line else (indent - base if hangs else along)
  return "\n".join([lines[0], *(_shift(line, delta) for line, delta in
                                 zip(lines[1:], deltas[1:], strict=True))])


def _anchors(code: str) -> dict[int, tuple[int, bool, bool] | None]:
  """For each continuation line of ``code``: the line that opened the innermost bracket its
  start is inside, whether that bracket ends its line (a hanging indent), and whether the
  line starts by closing it; None for a line outside brackets (after a backslash), or when
  ``code`` does not tokenize."""
  anchors: dict[int, tuple[int, bool, bool] | None] = {}
  try:
    tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
  except (tokenize.TokenError, IndentationError, SyntaxError):
    return anchors
  stack: list[list] = []  # [line opened on, ends that line (None until the next token)]
  for tok in tokens:
    if tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                    tokenize.ENDMARKER):
      continue
    line = tok.start[0] - 1
    if stack and stack[-1][1] is None and tok.type != tokenize.COMMENT:
      stack[-1][1] = line > stack[-1][0]
    if line and line not in anchors:
      closes = tok.type == tokenize.OP and tok.string in (")", "]", "}")
      anchors[line] = (stack[-1][0], bool(stack[-1][1]), closes) if stack else None
    if tok.type == tokenize.OP and tok.string in ("(", "[", "{"):
      stack.append([tok.end[0] - 1, None])
    elif tok.type == tokenize.OP and tok.string in (")", "]", "}") and stack:
      stack.pop()
  return anchors


def _lead(line: str) -> int:
  return len(line) - len(line.lstrip(" "))


def _shift(line: str, delta: int) -> str:
  """``line`` moved ``delta`` columns (right if positive), never past its start."""
  if delta >= 0:
    return " " * delta + line if line.strip() else line
  return line[min(-delta, _lead(line)):]


class _AbsoluteIndent(cst.CSTTransformer):
  """Continuation lines (and comment lines between them) carry their full indentation,
  not the enclosing block's on top."""

  def leave_ParenthesizedWhitespace(self, original_node, updated_node):
    return updated_node.with_changes(indent=False)

  def leave_EmptyLine(self, original_node, updated_node):
    return updated_node.with_changes(indent=False)


def parse_expression(text: str) -> cst.BaseExpression:
  return cast(cst.BaseExpression, cst.parse_expression(text).visit(_AbsoluteIndent()))


def parse_simple_statement(text: str) -> cst.SimpleStatementLine:
  """A one-line statement's text whose continuation lines carry their full indentation."""
  return cast(cst.SimpleStatementLine, cst.parse_statement(text).visit(_AbsoluteIndent()))


def breakable(text: str) -> Value:
  """Generated one-line code (``name=value`` or a value) as a tree the layout can break:
  calls and tuples of two or more items become ``Call``s (a tuple is a call with no name);
  what else it holds stays text. Text that does not parse stays as it is."""
  keyword = ""
  head, sep, rest = text.partition("=")
  if sep and head.isidentifier() and not rest.startswith("="):
    keyword, text = head + "=", rest
  try:
    node = cst.parse_expression(text)
  except cst.ParserSyntaxError:
    return keyword + text
  value = _breakable(node)
  if keyword and isinstance(value, Call) and isinstance(value.func, str):
    return Call(keyword + value.func, value.args)
  return keyword + text if keyword else value


def _breakable(node: cst.BaseExpression) -> Value:
  if (isinstance(node, cst.Tuple) and len(node.lpar) == 1 and len(node.elements) > 1
      and not any(isinstance(e, cst.StarredElement) for e in node.elements)):
    return Call("", tuple(_breakable(e.value) for e in node.elements))
  if isinstance(node, cst.Call) and not node.lpar and not any(a.star for a in node.args):
    func = _breakable(node.func) if isinstance(node.func, cst.Call) else _code(node.func)
    return Call(cast(str | Call, func), tuple(_argument(a) for a in node.args))
  return _code(node)


def _argument(arg: cst.Arg) -> Value:
  value = _breakable(arg.value)
  if arg.keyword is None:
    return value
  name = arg.keyword.value + "="
  if isinstance(value, Call) and isinstance(value.func, str):
    return Call(name + value.func, value.args)
  return name + _code(arg.value)


def _code(node: cst.CSTNode) -> str:
  return cst.Module([]).code_for_node(node)


def arguments_broken(statement: cst.SimpleStatementLine, indent: str, style: FileStyle
                     ) -> cst.SimpleStatementLine | None:
  """A one-line statement that renamed names took past the file's limit, laid out again:
  the arguments of its value's outermost call (an expression statement's, a return's or
  an assignment's value) one per line, hanging one continuation indent below it, or else
  that value alone on a hanging line in parentheses; None where no line then fits."""
  small = statement.body[0] if len(statement.body) == 1 else None
  value = getattr(small, "value", None)
  if not isinstance(value, cst.BaseExpression) or value.lpar:
    return None

  def new_line(hang: str = style.hang) -> cst.ParenthesizedWhitespace:
    return cst.ParenthesizedWhitespace(indent=True, last_line=cst.SimpleWhitespace(hang))

  layouts: list[cst.BaseExpression] = []
  if isinstance(value, cst.Call) and value.args:
    last = len(value.args) - 1
    args = [arg.with_changes(comma=arg.comma.with_changes(whitespace_after=new_line()))
            if isinstance(arg.comma, cst.Comma) and i < last else arg
            for i, arg in enumerate(value.args)]
    layouts.append(value.with_changes(whitespace_before_args=new_line(), args=args))
  layouts.append(value.with_changes(lpar=[cst.LeftParen(whitespace_after=new_line())],
                                    rpar=[cst.RightParen(whitespace_before=new_line(""))]))
  for layout in layouts:
    broken = statement.with_changes(body=[cast(cst.BaseSmallStatement, small).with_changes(
        value=layout)])
    lines = _code(broken.with_changes(leading_lines=[])).rstrip("\n").split("\n")
    if all(len(indent) + len(line) <= style.width for line in lines):
      return broken
  return None
