"""A file's text as the rewrite reads it: lines, tokens and layout, each read once.

libcst positions count lines at Python's line breaks only (``str.splitlines`` also breaks
at ``\\f``, ``\\v``, U+2028, ...), so the lines here are split the same way. Everything is
read on first use: a file with nothing to rewrite never tokenizes.
"""
from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Callable

import libcst as cst
from libcst.metadata import CodeRange

from codemod import file_style
from codemod.edits import Copied

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


class SourceText:
  """The text of one file (at ``path``, for its project's configuration, where it is one)."""

  def __init__(self, text: str, path: str | None = None) -> None:
    self.text = text
    self._path = path
    self._lines: list[str] | None = None
    self._tokens: list[tokenize.TokenInfo] = []
    self._string_starts: dict[int, int] = {}
    self._style: file_style.FileStyle | None = None

  def _load(self) -> list[str]:
    if self._lines is None:
      self._lines = _LINE_BREAK.split(self.text)
      self._tokens = _tokens(self.text)
      self._string_starts = _string_starts(self._tokens)
    return self._lines

  @property
  def lines(self) -> list[str]:
    return self._load()

  @property
  def tokens(self) -> list[tokenize.TokenInfo]:
    self._load()
    return self._tokens

  @property
  def style(self) -> file_style.FileStyle:
    """The file's layout conventions (its line limit from its project's configuration)."""
    if self._style is None:
      self._style = file_style.detect("\n".join(self.lines), self._path, tokens=self.tokens)
    return self._style

  def line(self, number: int) -> str:
    lines = self.lines
    return lines[number - 1] if number - 1 < len(lines) else ""

  def indent_of(self, number: int) -> str:
    """The indentation of line ``number``; for a line that starts inside a multi-line
    string (``\"\"\", jax.pmap(...)``), that of the line the string starts on."""
    self._load()
    text = self.line(self._string_starts.get(number, number))
    return text[:len(text) - len(text.lstrip())]

  def copied(self, node: cst.BaseExpression, position: Callable[[cst.CSTNode], CodeRange],
             keyword: str = "") -> Copied:
    """``node`` (with its parentheses) as written in the file, ``keyword`` before it."""
    start_node = node.lpar[0] if getattr(node, "lpar", None) else node
    end_node = node.rpar[-1] if getattr(node, "rpar", None) else node
    start, end = position(start_node).start, position(end_node).end
    if start.line == end.line:
      return Copied(keyword + cst.Module([]).code_for_node(node), start.column - len(keyword))
    lines = self.lines[start.line - 1:end.line]
    lines[-1] = lines[-1][:end.column]
    lines[0] = lines[0][start.column:]
    return Copied(keyword + "\n".join(lines), start.column - len(keyword))


def _tokens(text: str) -> list[tokenize.TokenInfo]:
  """The tokens of ``text`` (any line breaks), up to where it stops tokenizing."""
  found: list[tokenize.TokenInfo] = []
  try:
    found.extend(tokenize.generate_tokens(io.StringIO(text, newline=None).readline))
  except (tokenize.TokenError, IndentationError, SyntaxError):
    pass
  return found


def _string_starts(tokens: list[tokenize.TokenInfo]) -> dict[int, int]:
  """Line -> the line its multi-line string token starts on, for every line that starts
  inside one (1-based), from the text's ``tokens``."""
  starts: dict[int, int] = {}
  for tok in tokens:
    if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
      for line in range(tok.start[0] + 1, tok.end[0] + 1):
        starts[line] = starts.get(tok.start[0], tok.start[0])
  return starts
