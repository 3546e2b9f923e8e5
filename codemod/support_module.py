"""The shared module converted files import (``pmap_shard_map`` by default), as text.

Its body is ``codemod/support_source.py``; the copy written into a converted tree starts
with a header line carrying a version and the hash of the body, so a rerun can tell an
up-to-date copy (left alone) from an older one (replaced) and from a file it did not
write or that was edited since (never overwritten: an error names the flag to pick
another name). One text serves every --target and --multihost choice, so separate
runs over one tree agree on it.
"""
from __future__ import annotations

import enum
import hashlib
import os
import re
from dataclasses import dataclass

import libcst as cst

from codemod import files

VERSION = 2
DEFAULT_NAME = "pmap_shard_map"
NAMES_KEY = "pmap_to_shmap.support_names"  # context.scratch: the support names a file uses


def import_of(spelling: str | None) -> tuple[str, int] | None:
  """(module, leading dots) of how a file imports the support module: ``pmap_shard_map``,
  ``flax._pmap_shard_map`` or ``.._pmap_shard_map``; None where the support code is put
  into the file itself (a notebook)."""
  if spelling is None:
    return None
  module = spelling.lstrip(".")
  return module, len(spelling) - len(module)
_HEADER = "# Written by pmap-to-shmap: support module v{version} sha256:{digest}. Do not edit.\n"
_HEADER_RE = re.compile(
    r"# Written by pmap-to-shmap: support module v(\d+) sha256:([0-9a-f]{64})\. Do not edit\.")


def body() -> str:
  """The module's text without its header line: ``support_source.py``."""
  return _body()


def _body() -> str:
  with open(os.path.join(os.path.dirname(__file__), "support_source.py"), encoding="utf-8") as f:
    return f.read()


def source() -> str:
  """The module's full text, header included."""
  body = _body()
  digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
  return _HEADER.format(version=VERSION, digest=digest) + body


PACKAGE_NAME = "_pmap_shard_map"  # the module inside a package: private to it
_PROJECT_FILES = ("pyproject.toml", "setup.py", "setup.cfg")
_RELATIVE_IMPORT = re.compile(r"^[ \t]*from[ \t]+\.", re.M)


@dataclass(frozen=True)
class Placement:
  """Where a converted file's support module lives and how the file imports it."""
  root: str      # the directory on sys.path that `name` is relative to
  name: str      # dotted name under root: pmap_shard_map, flax._pmap_shard_map
  spelling: str  # what the file writes after `from`: name, or ``.._pmap_shard_map``


def package_of(path: str) -> tuple[str, list[str]] | None:
  """(directory holding the top-level package, package names down to the file's
  directory) for a file inside a package; None for a script.

  A package is a chain of directories with ``__init__.py``; in a project with a ``src/``
  layout (``src`` next to pyproject.toml, setup.py or setup.cfg) a directory below
  ``src`` counts without one (a namespace package).
  """
  directory = os.path.dirname(os.path.abspath(path))
  parts: list[str] = []
  while os.path.isfile(os.path.join(directory, "__init__.py")):
    directory, name = os.path.split(directory)
    parts.insert(0, name)
  if parts:
    return directory, parts
  below: list[str] = []
  directory = os.path.dirname(os.path.abspath(path))
  while True:
    parent, name = os.path.split(directory)
    if name == "src" and below and any(os.path.isfile(os.path.join(parent, project))
                                       for project in _PROJECT_FILES):
      return directory, below
    if parent == directory or not name.isidentifier():
      return None
    below.insert(0, name)
    directory = parent


def placement(path: str, text: str, scripts_root: str) -> Placement:
  """The support module a file at ``path`` imports: inside its top-level package when it
  is in one (an installed package ships it), imported the way the file imports its own
  package (relatively if it uses relative imports); else ``pmap_shard_map`` under
  ``scripts_root``, one copy for all the scripts of a run."""
  package = package_of(path)
  if package is None or not all(part.isidentifier() for part in package[1]):
    return Placement(scripts_root, DEFAULT_NAME, DEFAULT_NAME)
  root, parts = package
  name = f"{parts[0]}.{PACKAGE_NAME}"
  spelling = "." * len(parts) + PACKAGE_NAME if _RELATIVE_IMPORT.search(text) else name
  return Placement(root, name, spelling)


class Status(enum.Enum):
  MISSING = "missing"
  CURRENT = "current"  # this version, unedited
  STALE = "stale"      # written by an earlier version of the codemod, unedited
  FOREIGN = "foreign"  # not written by the codemod, or edited since


def status_of(text: str | None) -> Status:
  if text is None:
    return Status.MISSING
  first, _, body = text.partition("\n")
  match = _HEADER_RE.fullmatch(first)
  if not match or hashlib.sha256(body.encode("utf-8")).hexdigest() != match.group(2):
    return Status.FOREIGN
  return Status.CURRENT if text == source() else Status.STALE


def is_support_module(text: str) -> bool:
  """Whether ``text`` starts with the header a written support module has."""
  return _HEADER_RE.match(text) is not None


def path_for(root: str, name: str) -> str:
  """Where module ``name`` (dotted) lives under the directory ``root``."""
  if not name or not all(part.isidentifier() for part in name.split(".")):
    raise ValueError(f"--support-module must be a dotted module name, got {name!r}")
  return os.path.join(root, *name.split(".")) + ".py"


def read(root: str, name: str) -> str | None:
  path = path_for(root, name)
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8", newline="") as f:
    return f.read()


def status_at(root: str, name: str) -> Status:
  return status_of(read(root, name))


def foreign_message(root: str, name: str) -> str:
  return (f"{path_for(root, name)} exists but was not written by pmap-to-shmap (or was edited "
          f"since), so the converted files cannot import {name} from it; choose another "
          "name with --support-module")


def write(root: str, name: str) -> bool:
  """Writes the module under ``root`` unless an up-to-date copy is there; True if written.

  Raises ``FileExistsError`` for a foreign file (never overwritten).
  """
  status = status_at(root, name)
  if status is Status.FOREIGN:
    raise FileExistsError(foreign_message(root, name))
  if status is Status.CURRENT:
    return False
  path = path_for(root, name)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  files.write_atomically(path, source().encode("utf-8"))
  return True


def is_import_of_support(assignment) -> bool:
  """Whether a scope binding (libcst Assignment) was made by importing a support module
  (as in a rerun over converted code), so a rewrite may use the name it binds."""
  node = getattr(assignment, "node", None)
  if not isinstance(node, cst.ImportFrom) or node.module is None:
    return False
  return cst.Module([]).code_for_node(node.module).rsplit(".", 1)[-1].endswith("pmap_shard_map")
