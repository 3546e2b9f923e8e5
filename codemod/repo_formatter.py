"""The repository's own formatter, run over a converted file that it had already formatted.

A repository that formats with ruff, black or pyink checks that in CI (``ruff format
--check``, ``black --check``, ``pyink --check``): a converted file laid out any other way
fails that check. So where the repository configures one of them and the original file is
exactly what it writes, the converted file goes through it too, and only the lines the
codemod changed move.

Walking up from the file to the repository root, the nearest directory that configures a
formatter decides:

- ruff (.ruff.toml, ruff.toml, pyproject.toml ``[tool.ruff]``, or a ``ruff-format``
  pre-commit hook): ``ruff format`` with the settings ruff itself finds for the file;
  ruff settings beside black's, pyink's or yapf's count only where they have a
  ``format`` table or the pre-commit hook runs ruff's formatter;
- black (pyproject.toml ``[tool.black]``, or a ``black`` pre-commit hook): ``ruff format``,
  which writes black's style, with black's ``line-length``, ``skip-string-normalization``
  and ``skip-magic-trailing-comma``;
- pyink (``[tool.pyink]``): pyink itself with that pyproject.toml, where it is installed
  (ruff does not write its style: 4-column continuation lines in 2-column blocks);
- yapf: nothing.

The file is left as the codemod wrote it where no formatter is configured, where the one
configured is not installed, where the original is not already what the installed version
writes, or where the formatted text would not be the same program with the same comments.
"""
from __future__ import annotations

import functools
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import tokenize
from dataclasses import dataclass

from codemod import config_files, file_style, support_module

_TIMEOUT_S = 60
_PRE_COMMIT_HOOK = re.compile(r"^\s*-?\s*id:\s*['\"]?(ruff-format|black)['\"]?\s*$", re.M)


@dataclass(frozen=True)
class Formatter:
  """The repository's formatter as it runs on one file read from stdin."""
  command: tuple[str, ...]  # up to the file's part: ``ruff format --line-length 100``
  name: str                 # the formatter the repository configures: ruff, black or pyink

  def format(self, text: str, path: str) -> str | None:
    """``text`` formatted as the file at ``path``; None where the formatter fails on it."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
      done = subprocess.run(
          [*self.command, "--stdin-filename", path, "-"],
          input=text.encode("utf-8"), capture_output=True, timeout=_TIMEOUT_S,
          cwd=directory if os.path.isdir(directory) else None, check=False)
    except (OSError, subprocess.TimeoutExpired):
      return None
    if done.returncode != 0:
      return None
    return done.stdout.decode("utf-8")


def configured(path: str) -> Formatter | None:
  """The formatter the repository holding ``path`` configures, where it is installed
  (ruff runs black's style)."""
  found = nearest(path)
  if found is None:
    return None
  directory, name, black = found
  if name in ("ruff", "black") and (ruff := _ruff()) is not None:
    return Formatter((ruff, "format", *(_black_options(black) if name == "black" else ())),
                     name)
  if name == "pyink" and (pyink := _pyink()) is not None:
    return Formatter((*pyink, "--config", os.path.join(directory, "pyproject.toml"),
                      "--quiet"), name)
  return None


def runs(name: str) -> bool:
  """Whether the codemod runs the formatter ``name`` (from ``nearest``) here."""
  return (_ruff() if name in ("ruff", "black") else _pyink() if name == "pyink"
          else None) is not None


def nearest(path: str) -> tuple[str, str, dict] | None:
  """(directory, name, black's settings) of the formatter that the nearest directory
  configuring one names for ``path``: ruff, black, pyink or yapf."""
  for directory in config_files.directories(os.path.dirname(os.path.abspath(path))):
    tool = config_files.pyproject_tools(directory)
    ruff = config_files.ruff(directory)
    others = [name for name in ("black", "pyink", "yapf")
              if config_files.table(tool, name) is not None]
    hook = _pre_commit_formatter(directory)
    black = config_files.table(tool, "black") or {}
    # ruff settings beside another formatter's are there for its linter, unless they
    # configure its formatter too.
    if ruff is not None and (not others or hook == "ruff-format"
                             or config_files.table(ruff, "format") is not None):
      return directory, "ruff", {}
    if "black" in others or (hook == "black" and not others):
      return directory, "black", black
    if others:
      return directory, others[0], {}
    if hook == "ruff-format":
      return directory, "ruff", {}
  return None


def _black_options(black: dict) -> tuple[str, ...]:
  # --isolated: black's settings alone, not a ruff configuration elsewhere on the machine.
  width = file_style.positive_width(black.get("line-length")) or file_style.FORMATTER_DEFAULT
  options = ["--isolated", "--line-length", str(width)]
  if black.get("skip-string-normalization") or black.get("skip_string_normalization"):
    options += ["--config", "format.quote-style='preserve'"]
  if black.get("skip-magic-trailing-comma") or black.get("skip_magic_trailing_comma"):
    options += ["--config", "format.skip-magic-trailing-comma=true"]
  return tuple(options)


def _pre_commit_formatter(directory: str) -> str | None:
  try:
    with open(os.path.join(directory, ".pre-commit-config.yaml"), encoding="utf-8") as f:
      text = f.read()
  except (OSError, UnicodeDecodeError):
    return None
  match = _PRE_COMMIT_HOOK.search(text)
  return match.group(1) if match else None


@functools.lru_cache(maxsize=1)
def _ruff() -> str | None:
  try:
    from ruff.__main__ import find_ruff_bin  # the ruff installed with this package
    return os.fspath(find_ruff_bin())
  except (ImportError, FileNotFoundError):
    return shutil.which("ruff")


@functools.lru_cache(maxsize=1)
def _pyink() -> tuple[str, ...] | None:
  if importlib.util.find_spec("pyink") is not None:  # installed with this Python
    # -I: the file's directory, where it runs, is not on sys.path (a package's own io/
    # would shadow the standard library's).
    return (sys.executable, "-I", "-m", "pyink")
  found = shutil.which("pyink")
  return None if found is None else (found,)


def formatter_of(original: str, path: str) -> Formatter | None:
  """The repository's formatter where it leaves ``original``, the file's text, unchanged."""
  formatter = configured(path)
  if formatter is None or formatter.format(original, path) != original:
    return None
  return formatter


def formats_any(formatter: Formatter, paths: list[str], sample: int = 20) -> bool:
  """Whether ``formatter`` leaves one of the .py files ``paths`` (the first ``sample`` of
  them, as they are on disk) unchanged: the repository formats with it, not only lints."""
  for path in [p for p in paths if p.endswith(".py")][:sample]:
    try:
      with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    except (OSError, UnicodeDecodeError):
      continue
    if formatter.format(text, path) == text:
      return True
  return False


def reformatted(formatter: Formatter, text: str, path: str) -> str | None:
  """``text`` laid out by ``formatter``, or None where that fails or would change the
  program or its comments."""
  out = formatter.format(text, path)
  if out is None or support_module.tree_digest(out) != support_module.tree_digest(text):
    return None
  if _comments(out) != _comments(text):
    return None
  return out


def _comments(text: str) -> list[str] | None:
  try:
    return sorted(tok.string.rstrip() for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                  if tok.type == tokenize.COMMENT)
  except (tokenize.TokenError, IndentationError, SyntaxError):
    return None
