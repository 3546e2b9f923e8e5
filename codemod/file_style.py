"""The layout conventions of the file being converted, so generated code reads like its own.

``detect(text, path)`` reads the line limit from the project's configuration, found by
walking up from the file (ruff/black ``line-length`` in pyproject.toml or ruff.toml,
flake8 ``max-line-length`` in setup.cfg / tox.ini / .flake8, yapf ``column_limit`` in
.style.yapf / setup.cfg / pyproject.toml, pylint ``max-line-length`` in pylintrc /
.pylintrc / setup.cfg / pyproject.toml); without one, from the file's own longest lines
(80 when they are all shorter). The continuation indent, the block indentation unit and
the quote style come from the file's text.
"""
from __future__ import annotations

import collections
import configparser
import io
import os
import re
import tokenize
from dataclasses import dataclass

try:  # Python 3.11+
  import tomllib
except ImportError:  # pragma: no cover - Python 3.10
  tomllib = None  # type: ignore[assignment]

DEFAULT_WIDTH = 80
_INI_FILES = (("setup.cfg", ("flake8", "pycodestyle", "yapf", "pylint.format", "pylint")),
              ("tox.ini", ("flake8", "pycodestyle")),
              (".flake8", ("flake8",)),
              (".style.yapf", ("style", "yapf")),
              ("pylintrc", ("format", "FORMAT")),
              (".pylintrc", ("format", "FORMAT")))
_INI_KEYS = ("max-line-length", "max_line_length", "column_limit")
_STOP_AT = (".git", ".hg")  # the repository root: configuration above it is not the project's


@dataclass(frozen=True)
class FileStyle:
  width: int          # the longest line the file allows
  hang: str           # continuation indent after a line ending in an open parenthesis
  unit: str           # one level of block indentation
  quote: str          # the quote character the file's strings use most


def detect(text: str, path: str | None = None) -> FileStyle:
  width = configured_width(path) if path else None
  return FileStyle(width or width_from_text(text), _hang(text), _unit(text), _quote(text))


def configured_width(path: str) -> int | None:
  """The line limit of the project holding ``path``, from the nearest configuration file."""
  directory = os.path.dirname(os.path.abspath(path))
  while True:
    width = _width_in(directory)
    if width is not None:
      return width
    parent = os.path.dirname(directory)
    if parent == directory or any(os.path.exists(os.path.join(directory, stop))
                                  for stop in _STOP_AT):
      return None
    directory = parent


def _width_in(directory: str) -> int | None:
  for name in ("pyproject.toml", "ruff.toml", ".ruff.toml"):
    width = _toml_width(os.path.join(directory, name))
    if width is not None:
      return width
  for name, sections in _INI_FILES:
    width = _ini_width(os.path.join(directory, name), sections)
    if width is not None:
      return width
  return None


def _toml_width(path: str) -> int | None:
  if tomllib is None or not os.path.isfile(path):
    return None
  try:
    with open(path, "rb") as f:
      data = tomllib.load(f)
  except (OSError, ValueError):
    return None
  tool = data.get("tool", {}) if not path.endswith("ruff.toml") else {"ruff": data}
  candidates = [tool.get("ruff", {}).get("line-length"), tool.get("black", {}).get("line-length"),
                tool.get("yapf", {}).get("column_limit"),
                tool.get("pylint", {}).get("format", {}).get("max-line-length")]
  return next((int(c) for c in candidates if isinstance(c, int) and c > 0), None)


def _ini_width(path: str, sections: tuple[str, ...]) -> int | None:
  if not os.path.isfile(path):
    return None
  parser = configparser.ConfigParser(interpolation=None, strict=False)
  try:
    parser.read(path, encoding="utf-8")
  except (configparser.Error, UnicodeDecodeError):
    return None
  for section in sections:
    if not parser.has_section(section):
      continue
    for key in _INI_KEYS:
      value = parser.get(section, key, fallback="").strip()
      if value.isdigit() and int(value) > 0:
        return int(value)
  return None


def width_from_text(text: str) -> int:
  """The file's own limit: what its long code lines reach (a stray long line, such as a
  URL, does not count), at least 80."""
  lengths = sorted(len(line.rstrip()) for line in text.splitlines()
                   if line.strip() and not line.lstrip().startswith("#")
                   and "://" not in line)
  if not lengths:
    return DEFAULT_WIDTH
  # The second longest line, or the 99.5th percentile in a long file: one outlier is not
  # the limit.
  index = max(0, len(lengths) - max(2, len(lengths) // 200))
  return max(DEFAULT_WIDTH, lengths[index])


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


def _quote(text: str) -> str:
  """The quote character of most of the file's one-line strings; double when undecided."""
  counts: collections.Counter = collections.Counter()
  try:
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
      if tok.type == tokenize.STRING and not tok.string.endswith(('"""', "'''")):
        match = _QUOTED.match(tok.string)
        if match and "'" not in tok.string[1:-1] and '"' not in tok.string[1:-1]:
          counts[match.group(1)] += 1
  except (tokenize.TokenError, IndentationError, SyntaxError):
    pass
  return "'" if counts["'"] > counts['"'] else '"'
