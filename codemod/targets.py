"""Which shard_map API a converted file is written for: the one that runs on every JAX the
file's repository declares.

Two forms exist, each running on a window of JAX releases (``FORMS``): ``experimental``
(``from jax.experimental.shard_map import shard_map``, ``check_rep=False``) and ``jax``
(``jax.shard_map``, ``check_vma=False``). ``for_file(path)`` reads the nearest declared
``jax`` requirement, walking up from the file to the repository root (``.git`` / ``.hg``):
in one directory ``pyproject.toml`` (``[project] dependencies``, then
``[tool.poetry.dependencies]``), ``setup.cfg`` (``[options] install_requires``),
``setup.py`` (its string literals), then ``requirements*.txt``. It picks ``jax`` where that
window holds the declared range, else ``experimental`` where that one does; where neither
does (``jax>=0.4.27``: ``jax.shard_map`` is missing before 0.6.1, the experimental module
is gone from 0.8) it says so, and the form follows the installed jax, as it does for a
file whose repository declares nothing.
"""
from __future__ import annotations

import ast
import functools
import glob
import os
import re
from dataclasses import dataclass

from codemod import config_files

Version = tuple[int, ...]

# form -> (first release it runs on, first release it does not run on; None: open).
FORMS: dict[str, tuple[Version, Version | None]] = {
    "experimental": ((0, 4, 31), (0, 8)),
    "jax": ((0, 6, 1), None),
}
TARGETS = tuple(FORMS)
# A requirement on jax itself (not jaxlib): extras, a specifier (PEP 508, poetry's ^ and ~,
# the old parenthesised form), then markers or a comment.
_REQUIREMENT = re.compile(
    r"^\s*jax\s*(\[[^\]]*\])?\s*(?P<spec>\(?\s*[<>=!~^][^;#]*)?\s*([;#].*)?$", re.IGNORECASE)


@dataclass(frozen=True)
class Declared:
  """A declared jax requirement: where, as written, and the releases it admits."""
  source: str
  text: str
  low: Version               # the oldest release admitted (0 when unbounded)
  high: Version | None       # the first release no longer admitted (None when unbounded)


# The first release whose shard_map keeps a function's output tree as it is (earlier ones
# rebuild it from placeholder leaves, which a pytree class checking its fields rejects).
SHARD_MAP_KEEPS_OUTPUT_TREES: Version = (0, 7, 2)


@dataclass(frozen=True)
class Choice:
  target: str
  declared: Declared | None
  serves: bool  # whether ``target`` runs on every release the declaration admits

  def admits_before(self, release: Version) -> bool:
    """Whether the file may run on a jax older than ``release``: its repository
    declares such a jax, or declares none and such a jax is installed (or none is)."""
    if self.declared is not None:
      return self.declared.low < release
    installed = installed_version()
    return installed is None or installed < release

  def note(self) -> str | None:
    """What the report says when no form runs on the whole declared range."""
    if self.declared is None or self.serves:
      return None
    d = self.declared
    windows = "; ".join(f"{name} from {_dotted(lo)}" + (f" to before {_dotted(hi)}" if hi else "")
                        for name, (lo, hi) in FORMS.items())
    return (f"written for --target {self.target}, which does not run on every jax that "
            f"{os.path.basename(d.source)} admits ({d.text!r}); no shard_map form does "
            f"({windows}): narrow the requirement, or keep the sites' pmap")


def serves(target: str, declared: Declared) -> bool:
  lo, hi = FORMS[target]
  if declared.low < lo:
    return False
  return hi is None or (declared.high is not None and declared.high <= hi)


def for_file(path: str | None, explicit: str | None = None) -> Choice:
  """The form for the file at ``path``: ``explicit`` (``--target``) when given, else the
  one that serves its repository's declared jax, else the installed jax's."""
  declared = declared_jax(os.path.dirname(os.path.abspath(path))) if path else None
  if explicit is not None:
    return Choice(explicit, declared, declared is None or serves(explicit, declared))
  if declared is not None:
    for target in ("jax", "experimental"):
      if serves(target, declared):
        return Choice(target, declared, True)
  return Choice(installed_target(), declared, declared is None)


def installed_target() -> str:
  """'experimental' for an installed jax older than 0.6.1 (no jax.shard_map), else 'jax'."""
  installed = installed_version()
  return "experimental" if installed is not None and installed < FORMS["jax"][0] else "jax"


def installed_version() -> Version | None:
  """The installed jax's release; None where none is installed."""
  try:
    from importlib.metadata import version
    return parse_version(version("jax"))
  except Exception:  # PackageNotFoundError, or no metadata at all
    return None


@functools.lru_cache(maxsize=256)
def declared_jax(directory: str) -> Declared | None:
  """The nearest jax requirement declared in ``directory`` or above it, up to the
  repository root."""
  return next((found for d in config_files.directories(directory)
               if (found := _declared_in(d)) is not None), None)


def _declared_in(directory: str) -> Declared | None:
  for name, read in (("pyproject.toml", _pyproject), ("setup.cfg", _setup_cfg),
                     ("setup.py", _setup_py)):
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      found = _first(path, read(path))
      if found is not None:
        return found
  for path in sorted(glob.glob(os.path.join(glob.escape(directory), "requirements*.txt"))):
    found = _first(path, _lines(path))
    if found is not None:
      return found
  return None


def _first(path: str, requirements: list[str]) -> Declared | None:
  for text in requirements:
    match = _REQUIREMENT.match(text)
    if match is None:
      continue  # another package (jaxlib, jaxtyping, ...), or prose in setup.py
    spec = (match.group("spec") or "").strip().strip("()")
    low, high = admitted(spec)
    return Declared(path, text.strip(), low, high)
  return None


def admitted(spec: str) -> tuple[Version, Version | None]:
  """The releases a version specifier admits, as [low, high): ``>=0.4.27,<0.6`` ->
  ((0, 4, 27), (0, 6)). Poetry's ``^`` / ``~`` count too; ``!=`` narrows nothing."""
  low: Version = (0,)
  high: Version | None = None
  for clause in filter(None, (c.strip() for c in spec.split(","))):
    match = re.match(r"(===|==|~=|>=|<=|!=|>|<|\^|~)?\s*v?([0-9][0-9.*]*)", clause)
    if match is None:
      continue
    op, text = match.group(1) or "==", match.group(2).rstrip(".")
    version = parse_version(text.replace("*", "0"))
    if op in ("==", "===") and "*" in text:  # ==0.4.*: the 0.4 series
      prefix = tuple(int(p) for p in text.split(".") if p and p != "*")
      lo, hi = prefix, _bump(prefix, len(prefix) - 1)
    elif op in ("==", "==="):
      lo, hi = version, version + (0, 0, 0, 1)  # just this release
    elif op == "~=":
      lo, hi = version, _bump(version, max(len(version) - 2, 0))
    elif op == "^":  # poetry: the leftmost non-zero part stays
      lead = next((i for i, p in enumerate(version) if p), len(version) - 1)
      lo, hi = version, _bump(version, lead)
    elif op == "~":  # poetry: the minor part stays (the major alone when only it is given)
      lo, hi = version, _bump(version, min(1, len(version) - 1))
    elif op in (">=", ">"):
      lo, hi = version, None
    elif op == "<":
      lo, hi = (0,), version
    elif op == "<=":
      lo, hi = (0,), version + (0, 0, 0, 1)
    else:  # !=
      continue
    low = max(low, lo)
    high = hi if high is None else (high if hi is None else min(high, hi))
  return low, high


def parse_version(text: str) -> Version:
  """``0.4.35`` -> (0, 4, 35); a suffix (``rc1``, ``.dev``) is dropped from its part."""
  parts = []
  for part in text.split(".")[:4]:
    digits = re.match(r"\d*", part).group(0)  # type: ignore[union-attr]
    if not digits:
      break
    parts.append(int(digits))
  while len(parts) > 1 and parts[-1] == 0:
    parts.pop()
  return tuple(parts) or (0,)


def _bump(version: Version, index: int) -> Version:
  return version[:index] + (version[index] + 1,) if index < len(version) else version


def _dotted(version: Version) -> str:
  return ".".join(str(p) for p in version)


def _pyproject(path: str) -> list[str]:
  data = config_files.toml(path)
  if data is None:
    return []
  found = [d for d in data.get("project", {}).get("dependencies", []) if isinstance(d, str)]
  poetry = data.get("tool", {}).get("poetry", {}).get("dependencies", {})
  value = poetry.get("jax") if isinstance(poetry, dict) else None
  if isinstance(value, dict):
    value = value.get("version")
  if isinstance(value, str):
    found.append("jax " + value.replace(" ", ""))
  return found


def _setup_cfg(path: str) -> list[str]:
  parser = config_files.ini(path)
  if parser is None:
    return []
  return parser.get("options", "install_requires", fallback="").splitlines()


def _setup_py(path: str) -> list[str]:
  try:
    with open(path, encoding="utf-8") as f:
      tree = ast.parse(f.read())
  except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
    return []
  return [node.value for node in ast.walk(tree)
          if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def _lines(path: str) -> list[str]:
  try:
    with open(path, encoding="utf-8") as f:
      return f.read().splitlines()
  except (OSError, UnicodeDecodeError):
    return []
