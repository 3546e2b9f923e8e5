"""The layout conventions of the file being converted, so generated code reads like its own.

``detect(text, path)`` takes the line limit from the project's configuration, found by
walking up from the file to the repository root (the directory holding .git or .hg); the
nearest directory with a setting wins. In one directory, a formatter's width comes before
a linter's ceiling, since the formatter decides how the code is wrapped:

1. ruff ``line-length`` (.ruff.toml, ruff.toml, pyproject.toml ``[tool.ruff]``, following
   ``extend``), black and pyink ``line-length`` (pyproject.toml), yapf ``column_limit``
   (pyproject.toml ``[tool.yapf]``, .style.yapf ``[style]``, setup.cfg ``[yapf]``);
2. such a formatter configured without a width: its default, 88 for ruff, black and pyink,
   79 or 80 for yapf (after ``based_on_style``);
3. ruff's ``[lint.pycodestyle] max-line-length``, flake8 / pycodestyle
   ``max-line-length`` (setup.cfg, tox.ini, .flake8), pylint ``max-line-length`` (any
   ``[tool.pylint.*]`` table, pylintrc, .pylintrc, ``[pylint*]`` in setup.cfg / tox.ini).
   A linter configured without a limit says nothing (pylint's 100 is a ceiling, rarely
   the code's width).

Without any of these, ``max_line_length`` from .editorconfig applies (its own rules: the
matching sections of every .editorconfig up to one with ``root = true``, later ones
overriding earlier, ``off`` unsetting it). Without that, the limit is what the file's code
reaches: the lengths of code, never comments, docstrings or the lines inside a multi-line
string, 80 when shorter. The continuation indent, the block indentation unit and the
quote style come from the file's text; the import sorting from ``import_style``.
"""
from __future__ import annotations

import collections
import io
import os
import re
import tokenize
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from codemod import config_files, import_style
from codemod.import_style import ImportStyle

DEFAULT_WIDTH = 80
FORMATTER_DEFAULT = 88  # ruff's, black's and pyink's line-length
_YAPF_STYLES = {"pep8": 79, "google": 80, "yapf": 80, "chromium": 80, "facebook": 80}
# Code that reaches a few columns short of a common limit was written to that limit.
_COMMON_WIDTHS = (88, 100, 120)
_SNAP = 4


@dataclass(frozen=True)
class FileStyle:
  width: int          # the longest line the file allows
  hang: str           # continuation indent after a line ending in an open parenthesis
  unit: str           # one level of block indentation
  quote: str          # the quote character the file's strings use most
  imports: ImportStyle | None = None  # the repository's configured import sorting


def detect(text: str, path: str | None = None,
           tokens: Sequence[tokenize.TokenInfo] | None = None) -> FileStyle:
  """``tokens``: ``text``'s, up to where it stops tokenizing, when the caller has them."""
  width = configured_width(path) if path else None
  return FileStyle(width or width_from_text(text), _hang(text), _unit(text),
                   _quote(text, tokens), import_style.configured(path) if path else None)


def configured_width(path: str) -> int | None:
  """The line limit of the project holding ``path``, from the nearest configuration file."""
  for directory in config_files.directories(os.path.dirname(os.path.abspath(path))):
    width = _width_in(directory)
    if width is not None:
      return width
  return editorconfig_width(path)


def _width_in(directory: str) -> int | None:
  """The limit this directory's configuration files set, by the order in the docstring."""
  tool = config_files.pyproject_tools(directory)
  ruff = config_files.ruff(directory)
  yapf = _yapf_settings(directory, tool)
  formatters: list[tuple[dict | None, str, int]] = [
      (ruff, "line-length", FORMATTER_DEFAULT),
      (config_files.table(tool, "black"), "line-length", FORMATTER_DEFAULT),
      (config_files.table(tool, "pyink"), "line-length", FORMATTER_DEFAULT),
      (yapf, "column_limit", _yapf_default(yapf))]
  for settings, key, _ in formatters:
    width = positive_width((settings or {}).get(key))
    if width is not None:
      return width
  for settings, _, default in formatters:
    if settings is not None:
      return default
  return next((w for w in (_ruff_pycodestyle(ruff), _flake8_width(directory),
                           _pylint_width(directory, tool)) if w is not None), None)


def positive_width(value: Any) -> int | None:
  """A configured width: an int, or a string of digits (ini files, yapf's toml)."""
  if isinstance(value, bool):
    return None
  if isinstance(value, str):
    match = re.match(r"\s*(\d+)", value)  # pylint allows a comment after the value
    value = int(match.group(1)) if match else None
  return value if isinstance(value, int) and value > 0 else None


def _ruff_pycodestyle(ruff: dict | None) -> int | None:
  if ruff is None:
    return None
  # [lint.pycodestyle], then the old place
  for holder in (config_files.table(ruff, "lint") or {}, ruff):
    width = positive_width((config_files.table(holder, "pycodestyle") or {}).get("max-line-length"))
    if width is not None:
      return width
  return None


def _yapf_settings(directory: str, tool: dict) -> dict | None:
  """yapf's style options, from the first of its files that has a section for them."""
  found = config_files.table(tool, "yapf")
  if found is not None:
    return found
  for name, section in ((".style.yapf", "style"), ("setup.cfg", "yapf")):
    parser = config_files.ini(os.path.join(directory, name))
    if parser is not None and parser.has_section(section):
      return dict(parser.items(section))
  return None


def _yapf_default(yapf: dict | None) -> int:
  style = str((yapf or {}).get("based_on_style", "pep8")).strip().lower()
  return _YAPF_STYLES.get(style, _YAPF_STYLES["pep8"])


def _flake8_width(directory: str) -> int | None:
  for name, sections in (("setup.cfg", ("flake8", "pycodestyle", "pep8")),
                         ("tox.ini", ("flake8", "pycodestyle", "pep8")),
                         (".flake8", ("flake8",))):
    parser = config_files.ini(os.path.join(directory, name))
    for section in sections:
      if parser is None or not parser.has_section(section):
        continue
      for key in ("max-line-length", "max_line_length"):
        width = positive_width(parser.get(section, key, fallback=None))
        if width is not None:
          return width
  return None


def _pylint_width(directory: str, tool: dict) -> int | None:
  # pylint reads an option from any table under [tool.pylint], from any section of a
  # pylintrc, and from the sections named pylint* of setup.cfg and tox.ini.
  width = _pylint_width_from_tool(tool)
  for name in ("pylintrc.toml", ".pylintrc.toml"):
    data = config_files.toml(os.path.join(directory, name))
    width = width or (_pylint_width_from_tool(data.get("tool") or {}) if data else None)
  for name in ("pylintrc", ".pylintrc"):
    width = width or _ini_option(os.path.join(directory, name), lambda section: True)
  for name in ("setup.cfg", "tox.ini"):
    width = width or _ini_option(os.path.join(directory, name),
                                 lambda section: section.startswith("pylint"))
  return width


def _pylint_width_from_tool(tool: dict) -> int | None:
  pylint = config_files.table(tool, "pylint") or {}
  values = [pylint.get("max-line-length"),
            *(t.get("max-line-length") for t in pylint.values() if isinstance(t, dict))]
  return next((w for w in map(positive_width, values) if w is not None), None)


def _ini_option(path: str, wanted: Callable[[str], bool]) -> int | None:
  parser = config_files.ini(path)
  if parser is None:
    return None
  for section in parser.sections():
    if wanted(section.lower()):
      width = positive_width(parser.get(section, "max-line-length", fallback=None))
      if width is not None:
        return width
  return None


def editorconfig_width(path: str) -> int | None:
  """``max_line_length`` for ``path`` from the .editorconfig files above it (up to the
  repository root or one with ``root = true``), the nearest file and later section winning."""
  path = os.path.abspath(path)
  files = []
  directory = os.path.dirname(path)
  while True:
    config = os.path.join(directory, ".editorconfig")
    if os.path.isfile(config):
      root, sections = _editorconfig(config)
      files.append((directory, sections))
      if root:
        break
    parent = os.path.dirname(directory)
    if parent == directory or config_files.is_root(directory):
      break
    directory = parent
  width: int | None = None
  for directory, sections in reversed(files):  # the farthest first: nearer ones override
    relative = os.path.relpath(path, directory).replace(os.sep, "/")
    for glob, properties in sections:
      value = properties.get("max_line_length")
      if value is not None and _editorconfig_match(glob, relative):
        width = positive_width(value) if value != "off" else None
  return width


def _editorconfig(path: str) -> tuple[bool, list[tuple[str, dict[str, str]]]]:
  """Whether the file says ``root = true``, and its sections' globs and properties."""
  root = False
  sections: list[tuple[str, dict[str, str]]] = []
  try:
    with open(path, encoding="utf-8-sig") as f:
      lines = f.read().splitlines()
  except (OSError, UnicodeDecodeError):
    return False, []
  for line in lines:
    line = line.strip()
    if not line or line.startswith(("#", ";")):
      continue
    header = re.fullmatch(r"\[(.*)\]", line)
    if header:
      sections.append((header.group(1), {}))
      continue
    key, sep, value = line.partition("=")
    if not sep:
      continue
    key, value = key.strip().lower(), value.strip().lower()
    if sections:
      sections[-1][1][key] = value
    elif key == "root":
      root = value == "true"
  return root, sections


def _editorconfig_match(glob: str, relative: str) -> bool:
  """Whether the section ``glob`` matches ``relative``, the path from its file's directory."""
  if "/" not in glob:
    glob = "**/" + glob
  pattern = _glob_regex(glob.lstrip("/"))
  return re.fullmatch(pattern, relative) is not None or (
      glob.startswith("**/") and re.fullmatch(_glob_regex(glob[3:]), relative) is not None)


def _glob_regex(glob: str) -> str:
  """EditorConfig's glob syntax (``*``, ``**``, ``?``, ``[...]``, ``{a,b}``, ``{1..9}``)."""
  out, i = [], 0
  while i < len(glob):
    c = glob[i]
    brace = _closing_brace(glob, i) if c == "{" else None
    if c == "\\" and i + 1 < len(glob):
      out.append(re.escape(glob[i + 1]))
      i += 1
    elif glob.startswith("**", i):
      out.append(".*")
      i += 1
    elif c == "*":
      out.append("[^/]*")
    elif c == "?":
      out.append("[^/]")
    elif c == "[" and "]" in glob[i + 2:]:
      end = glob.index("]", i + 2)
      chars = glob[i + 1:end].replace("\\", "\\\\")
      if chars.startswith("!"):
        chars = "^" + chars[1:]
      elif chars.startswith("^"):
        chars = "\\" + chars
      out.append(f"[{chars}]")
      i = end
    elif brace is not None:
      body = glob[i + 1:brace]
      numbers = re.fullmatch(r"([+-]?\d+)\.\.([+-]?\d+)", body)
      if numbers:
        low, high = sorted(int(n) for n in numbers.groups())
        out.append("(?:" + "|".join(str(n) for n in range(low, min(high, low + 1000) + 1)) + ")")
      else:
        out.append("(?:" + "|".join(_glob_regex(part) for part in _split_top(body)) + ")")
      i = brace
    else:
      out.append(re.escape(c))
    i += 1
  return "".join(out)


def _closing_brace(glob: str, start: int) -> int | None:
  depth = 0
  for i in range(start, len(glob)):
    if glob[i] == "{":
      depth += 1
    elif glob[i] == "}":
      depth -= 1
      if depth == 0:
        return i
  return None


def _split_top(body: str) -> list[str]:
  """``a,{b,c},d`` -> ``a``, ``{b,c}``, ``d``."""
  parts, depth, current = [], 0, ""
  for c in body:
    if c == "," and depth == 0:
      parts.append(current)
      current = ""
      continue
    depth += (c == "{") - (c == "}")
    current += c
  return [*parts, current]


def width_from_text(text: str) -> int:
  """The file's own limit: what its long code lines reach (a stray long line, such as a
  URL, does not count), at least 80, raised to a common limit a few columns above it."""
  lengths = sorted(code_lengths(text))
  if not lengths:
    return DEFAULT_WIDTH
  # The second longest line, or the 99.5th percentile in a long file: one outlier is not
  # the limit.
  reached = lengths[max(0, len(lengths) - max(2, len(lengths) // 200))]
  if reached <= DEFAULT_WIDTH:
    return DEFAULT_WIDTH
  return next((w for w in _COMMON_WIDTHS if reached <= w <= reached + _SNAP), reached)


_TEXT = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
         tokenize.ENDMARKER}
# Python 3.12+ splits an f-string into tokens (3.14 a t-string too).
_STRING_START = {getattr(tokenize, n) for n in ("FSTRING_START", "TSTRING_START")
                 if hasattr(tokenize, n)}
_STRING_END = {getattr(tokenize, n) for n in ("FSTRING_END", "TSTRING_END") if hasattr(tokenize, n)}


def code_lengths(text: str) -> list[int]:
  """For each line holding code, the column where its code ends: without its comment, and
  leaving out the lines inside a multi-line string, docstrings (and other statements that
  are only a string) and lines with a URL in a string."""
  try:
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
  except (tokenize.TokenError, IndentationError, SyntaxError):
    return _code_lengths_by_line(text)
  ends: dict[int, int] = {}
  urls: set[int] = set()
  statement: list[tuple[int, int]] = []  # (line, end column) of its tokens on one line
  only_strings = True
  depth, first = 0, 0  # f-strings open around the token; the line the outermost starts on
  for tok in tokens:
    if tok.type in _STRING_START:
      depth, first = depth + 1, first if depth else tok.start[0]
    if depth or tok.type == tokenize.STRING:
      if "://" in tok.string:
        urls.add(tok.start[0])
      if tok.type in _STRING_END:
        depth -= 1
      # A string is code on the line it ends on, when it starts there too; the lines of a
      # multi-line one are its text.
      if not depth and tok.start[0] == tok.end[0] and (tok.type == tokenize.STRING
                                                       or first == tok.end[0]):
        statement.append((tok.end[0], tok.end[1]))
    elif tok.type == tokenize.NEWLINE:
      if not only_strings:
        for line, end in statement:
          ends[line] = max(ends.get(line, 0), end)
      statement, only_strings = [], True
    elif tok.type not in _TEXT:
      only_strings = False
      statement.append((tok.end[0], tok.end[1]))
  return [end for line, end in ends.items() if line not in urls]


def _code_lengths_by_line(text: str) -> list[int]:
  """The same, for text that does not tokenize: comment-only lines and a trailing comment
  that holds no quote left out."""
  lengths = []
  for line in text.splitlines():
    code = re.sub(r"\s+#[^'\"]*$", "", line).rstrip()
    if code and not code.lstrip().startswith("#") and "://" not in code:
      lengths.append(len(code))
  return lengths


def _unit(text: str) -> str:
  """The smallest step between the indentation of consecutive block lines: 2 or 4 spaces."""
  steps: collections.Counter = collections.Counter()
  lines = [line for line in text.splitlines() if line.strip()]
  for before, after in zip(lines, lines[1:], strict=False):
    if before.rstrip().endswith(":"):
      step = (len(after) - len(after.lstrip(" "))) - (len(before) - len(before.lstrip(" ")))
      if step > 0:
        steps[step] += 1
  if not steps:
    return "    "
  return " " * steps.most_common(1)[0][0]


def _hang(text: str) -> str:
  """The indent of a continuation line after a line ending in an open bracket: the file's
  most common one, else 4 spaces (PEP 8's and Google's)."""
  steps: collections.Counter = collections.Counter()
  lines = text.splitlines()
  for before, after in zip(lines, lines[1:], strict=False):
    if before.rstrip().endswith(("(", "[", "{")) and after.strip():
      step = (len(after) - len(after.lstrip(" "))) - (len(before) - len(before.lstrip(" ")))
      if step in (2, 4, 8):
        steps[step] += 1
  return " " * (steps.most_common(1)[0][0] if steps else 4)


_QUOTED = re.compile(r"""^[rbuRBUfF]{0,2}(['"])""")


def _quote(text: str, tokens: Sequence[tokenize.TokenInfo] | None = None) -> str:
  """The quote character of most of the file's one-line strings; double when undecided."""
  if tokens is None:
    found: list[tokenize.TokenInfo] = []
    try:
      found.extend(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
      pass
    tokens = found
  counts: collections.Counter = collections.Counter()
  for tok in tokens:
    if tok.type == tokenize.STRING and not tok.string.endswith(('"""', "'''")):
      match = _QUOTED.match(tok.string)
      if match and "'" not in tok.string[1:-1] and '"' not in tok.string[1:-1]:
        counts[match.group(1)] += 1
  return "'" if counts["'"] > counts['"'] else '"'
