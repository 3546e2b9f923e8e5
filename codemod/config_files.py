"""Reading a repository's configuration files: TOML and ini files, ruff's settings with
what they ``extend``, and the repository root above which nothing is the project's.

``file_style`` (the line limit) and ``import_style`` (how imports are sorted) read the
same files through these."""
from __future__ import annotations

import configparser
import functools
import os
from collections.abc import Iterator

try:  # Python 3.11+
  import tomllib
except ImportError:  # pragma: no cover - Python 3.10
  tomllib = None  # type: ignore[assignment]

_STOP_AT = (".git", ".hg")  # the repository root: configuration above it is not the project's


def is_root(directory: str) -> bool:
  return any(os.path.exists(os.path.join(directory, stop)) for stop in _STOP_AT)


def directories(start: str) -> Iterator[str]:
  """The directory ``start``, then each above it, up to the repository root."""
  directory = os.path.abspath(start)
  while True:
    yield directory
    parent = os.path.dirname(directory)
    if parent == directory or is_root(directory):
      return
    directory = parent


def toml(path: str) -> dict | None:
  """The TOML file's tables (None where it is missing or not TOML); each file version is
  parsed once, though every converted file's walk reads it for each setting."""
  if tomllib is None:
    return None
  try:
    stat = os.stat(path)
  except OSError:
    return None
  return _parsed_toml(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=256)
def _parsed_toml(path: str, mtime_ns: int, size: int) -> dict | None:
  del mtime_ns, size  # the cache key: a changed file is parsed again
  try:
    with open(path, "rb") as f:
      return tomllib.load(f)
  except (OSError, ValueError):
    return None


def table(data: dict, name: str) -> dict | None:
  value = data.get(name)
  return value if isinstance(value, dict) else None


def ini(path: str) -> configparser.ConfigParser | None:
  if not os.path.isfile(path):
    return None
  parser = configparser.ConfigParser(interpolation=None, strict=False)
  try:
    parser.read(path, encoding="utf-8-sig")
  except (configparser.Error, UnicodeDecodeError):
    return None
  return parser


def pyproject_tools(directory: str) -> dict:
  """The ``[tool]`` table of the directory's pyproject.toml (empty without one)."""
  tool = (toml(os.path.join(directory, "pyproject.toml")) or {}).get("tool")
  return tool if isinstance(tool, dict) else {}


def ruff(directory: str) -> dict | None:
  """Ruff's settings in this directory (.ruff.toml, ruff.toml, then pyproject.toml's
  ``[tool.ruff]``), with what they leave unset taken from the file they ``extend``."""
  found = next((data for data in (toml(os.path.join(directory, name))
                                  for name in (".ruff.toml", "ruff.toml")) if data is not None),
               pyproject_tools(directory).get("ruff"))
  return _extended(found, directory) if isinstance(found, dict) else None


def _extended(settings: dict, directory: str, depth: int = 0) -> dict:
  extend = settings.get("extend")
  if not isinstance(extend, str) or depth > 8:
    return settings
  path = os.path.join(directory, os.path.expanduser(extend))
  base = toml(path)
  if base is None:
    return settings
  if os.path.basename(path) == "pyproject.toml":
    base = table(base.get("tool") or {}, "ruff") or {}
  base = _extended(base, os.path.dirname(path), depth + 1)
  return {**base, **settings,
          "lint": {**(table(base, "lint") or {}), **(table(settings, "lint") or {})}}
