"""How the repository sorts its imports, from its ruff or isort configuration, so the
imports a converted file gets are where the repository's sorter puts them.

Walking up from the file to the repository root, the nearest directory that configures
a sorter decides:

- ruff, where it sorts (``I`` / ``I001`` selected, or a ``[lint.isort]`` table):
  ``force-sort-within-sections``, ``force-single-line``, ``known-first-party`` and
  ``lines-after-imports`` of its ``[lint.isort]`` table (``[isort]`` in older
  configurations), ruff's defaults otherwise;
- isort (pyproject.toml ``[tool.isort]``, .isort.cfg ``[settings]``, setup.cfg or tox.ini
  ``[isort]`` / ``[tool:isort]``): its ``profile`` (``google`` sorts ``import m`` and
  ``from m import x`` together and puts one name per ``from`` import), then the same
  four options, which override the profile.

A module is first party to the sorter when configured so or when it is found in one of
its source roots (``src`` / ``src_paths``, by default the configuration's directory and its
``src``). That holds for the support module too: beside a script outside those roots it
is third party to the sorter, and its import goes there.

Where nothing configures a sorter, ``None``: the file's own order decides (``imports``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from codemod import config_files


@dataclass(frozen=True)
class ImportStyle:
  force_sort_within_sections: bool   # ``import m`` and ``from m import x`` sorted together
  force_single_line: bool            # one name per ``from`` import
  known_first_party: frozenset[str]  # top-level modules the sorter puts in first party
  source_roots: tuple[str, ...] = ()  # where the sorter finds first-party modules
  lines_after_imports: int = -1  # blank lines after the import block (-1: the sorter's own)

  def first_party(self, top: str, written_in: str | None = None) -> bool:
    """Whether the sorter puts ``top`` in first party; ``written_in``: the directory the
    codemod writes it to (a support module not written yet)."""
    return top in self.known_first_party or any(
        directory == written_in or os.path.exists(os.path.join(directory, top + ".py"))
        or os.path.isdir(os.path.join(directory, top)) for directory in self.source_roots)


# What isort's profiles set of these options (the others leave isort's defaults).
_PROFILES = {"google": {"force_sort_within_sections": True, "force_single_line": True}}
_ISORT_INI = ((".isort.cfg", ("settings", "isort", "tool:isort")),
              ("setup.cfg", ("isort", "tool:isort")),
              ("tox.ini", ("isort", "tool:isort")))


def configured(path: str) -> ImportStyle | None:
  """The import sorting the project holding ``path`` configures, or None."""
  for directory in config_files.directories(os.path.dirname(os.path.abspath(path))):
    style = _ruff_style(directory) or _isort_style(directory)
    if style is not None:
      return style
  return None


def _ruff_style(directory: str) -> ImportStyle | None:
  ruff = config_files.ruff(directory)
  if ruff is None:
    return None
  lint = config_files.table(ruff, "lint") or {}
  isort = config_files.table(lint, "isort") or config_files.table(ruff, "isort")
  selected = [code for holder in (lint, ruff) for key in ("select", "extend-select")
              for code in holder.get(key) or () if isinstance(code, str)]
  if isort is None and not any(code in ("I", "I0", "I00", "I001", "ALL") for code in selected):
    return None
  isort = isort or {}
  return ImportStyle(_flag(isort.get("force-sort-within-sections")) or False,
                     _flag(isort.get("force-single-line")) or False,
                     _names(isort.get("known-first-party")),
                     _roots(directory, ruff.get("src")),
                     _count(isort.get("lines-after-imports")))


def _isort_style(directory: str) -> ImportStyle | None:
  settings = config_files.table(config_files.pyproject_tools(directory), "isort")
  for name, sections in _ISORT_INI:
    if settings is not None:
      break
    parser = config_files.ini(os.path.join(directory, name))
    section = next((s for s in sections if parser is not None and parser.has_section(s)), None)
    if parser is not None and section is not None:
      settings = dict(parser.items(section))
  if settings is None:
    return None
  options = {key.replace("-", "_").lower(): value for key, value in settings.items()}
  profile = _PROFILES.get(str(options.get("profile", "")).strip().lower(), {})

  def option(name: str) -> bool:
    given = _flag(options.get(name))
    return profile.get(name, False) if given is None else given

  return ImportStyle(option("force_sort_within_sections"), option("force_single_line"),
                     _names(options.get("known_first_party")),
                     _roots(directory, options.get("src_paths")),
                     _count(options.get("lines_after_imports")))


def _flag(value: object) -> bool | None:
  """A configured boolean: TOML's, or an ini file's text."""
  if isinstance(value, bool):
    return value
  if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "on"):
    return True
  if isinstance(value, str) and value.strip().lower() in ("false", "0", "no", "off"):
    return False
  return None


def _count(value: object) -> int:
  """A configured number of lines (TOML's, or an ini file's text); -1 where unset."""
  try:
    return int(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else -1
  except ValueError:
    return -1


def _names(value: object) -> frozenset[str]:
  """Module names: a TOML list, or an ini file's comma or line separated text."""
  if isinstance(value, str):
    value = value.replace("\n", ",").split(",")
  if not isinstance(value, (list, tuple)):
    return frozenset()
  return frozenset(str(name).strip() for name in value if str(name).strip())


def _roots(directory: str, configured: object) -> tuple[str, ...]:
  """The source roots, absolute: as configured (relative to ``directory``, the
  configuration's), else ``directory`` and its ``src``."""
  given = _names(configured) if configured is not None else frozenset()
  paths = sorted(given) if given else [".", "src"]
  return tuple(os.path.normpath(os.path.join(directory, p)) for p in paths)
