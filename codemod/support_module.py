"""The shared module converted files import (``pmap_shard_map`` by default), as text.

Its body is ``codemod/support_source.py``; the copy written into a converted tree starts
with a header line carrying a version and a digest of the body's syntax tree, so a rerun
can tell an up-to-date copy (left alone) from an older one (replaced) and from a file it
did not write or that was edited since (never overwritten: an error names the flag to
pick another name), whatever the repository's formatter (black, pyink, ruff format,
yapf) did to the copy's layout. Body and header fit in 80 columns. One text serves
every --target and --multihost choice, so separate runs over one tree agree on it.
"""
from __future__ import annotations

import ast
import enum
import functools
import hashlib
import itertools
import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import ScopeProvider

from codemod import config_files, files

# 16: the code for keyword calls, and pmap_via_shard_map's for static arguments and
# shard_map < 0.6.1, only where sites need it; 15: one statement per line, which black and
# pyink keep whole; pmap_via_shard_map over pmap_devices, with legacy's checks of run-time
# options; 14: shorter pmap_devices and
# placed_on; 13: on_first_call(lambda: site) for call sites; 12: pmap_devices(rows=n), a
# shorter per_device and placed_on; 11: the code for static arguments, keyword arguments
# and shard_map < 0.7.2 only where sites need it; 10: shorter first_rows and
# device_put_replicated; 9: a header that describes the module; 8: pmap_via_shard_map over
# per_device and placed_on; 7: static arguments and on_first_call in the plain form; 6:
# shorter plain-form helpers
VERSION = 16
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


# The header line, also the module's docstring: the version, and a digest of the
# body's syntax tree (what a formatter cannot change: see tree_digest), so a copy
# that the repository's formatter rewrote is still recognised as ours, and one edited
# since is never overwritten. Within 80 columns, like the body. v3 to v5 wrote it as a
# comment; v3 to v8 said "Do not edit".
_HEADER = '"""Helpers for pmap-to-shmap\'s output (v{version} sha256:{digest})."""\n'
_HEADER_RE = re.compile(
    r'"""Helpers for pmap-to-shmap\'s output \(v(\d+) sha256:([0-9a-f]{24})\)\."""'
    r'|"""pmap-to-shmap support v(\d+) sha256:([0-9a-f]{24})\. Do not edit\."""'
    r"|# pmap-to-shmap support module v(\d+) sha256:([0-9a-f]{24})\. Do not edit\.")
# v1 and v2 headers: the sha256 of the body's text, which a formatter changes.
_OLD_HEADER_RE = re.compile(
    r"# Written by pmap-to-shmap: support module v(\d+) sha256:([0-9a-f]{64})\. Do not edit\.")
# tree_digest of each body a v2 header was written with (support_source.py at each
# of its commits), so a copy of one that a formatter rewrote is replaced, not refused.
_V2_TREE_DIGESTS = frozenset({
    "ed146ce06b105c527c036076",  # e4948ce
    "31c2f533958d1eaba929fefa",  # a4a1350
    "36043ecdbfe920b2a305919c",  # b782744
    "3e76fd5f971285284ef8a55b",  # 1e359e3
    "fd2d25f9693701b9d8a7e9b0",  # d814f62
    "653b15f8f21f8a280eb4fe45",  # c199fc0
    "0ba57a02fff12a711db7cfb3",  # 749a099
    "c6ff8a8e8e873ad87902d111",  # 5879298
    "a0ea82841f3d033f56e67783",  # 6dc3c7a
    "c3ec7bd3b0186eea71e6b86e",  # 52c93b9
    "62079d76eb576736992626ed",  # 32521f8
    "b0954324127d9fd6054a1602",  # d4f346c
})


# The flags ``support_source.py`` tests (``if FLAG:``, ``a if FLAG else b``): a copy
# keeps the code a flag guards only where the repository's sites need it.
STATIC_ARGUMENTS = "STATIC_ARGUMENTS"  # a site with static_broadcasted_argnums
KEYWORD_CALLS = "KEYWORD_CALLS"  # a site some call may pass keywords
KEYWORD_ARGUMENTS = "KEYWORD_ARGUMENTS"  # keyword arguments no position takes
SHARD_MAP_BEFORE_0_7_2 = "SHARD_MAP_BEFORE_0_7_2"  # the repository admits such a jax
RUN_TIME_OPTIONS = "RUN_TIME_OPTIONS"  # pmap_via_shard_map's checks of its options
FEATURES = frozenset({STATIC_ARGUMENTS, KEYWORD_CALLS, KEYWORD_ARGUMENTS,
                      SHARD_MAP_BEFORE_0_7_2, RUN_TIME_OPTIONS})
# The flags a function's (or a flag's) code always needs: pmap_via_shard_map reads pmap's
# options, and its function's keyword arguments, only at run time; keyword arguments no
# position takes come through a call that passes keywords.
_ALWAYS_WITH = {"pmap_via_shard_map": frozenset({RUN_TIME_OPTIONS, KEYWORD_CALLS,
                                                  KEYWORD_ARGUMENTS}),
                KEYWORD_ARGUMENTS: frozenset({KEYWORD_CALLS})}


def body(names: Collection[str] | None = None) -> str:
  """The module's text without its header line: all of ``support_source.py`` with every
  flag's code, or, given ``names`` (functions and flags), its docstring with just those
  functions, what they use and the imports they need (``cut``)."""
  return resolved(FEATURES) if names is None else cut(frozenset(names))


@functools.lru_cache(maxsize=1)
def _body() -> str:
  with open(os.path.join(os.path.dirname(__file__), "support_source.py"), encoding="utf-8") as f:
    return f.read()


@functools.lru_cache(maxsize=16)
def resolved(features: frozenset[str]) -> str:
  """``support_source.py`` with each flag decided: the code under the flags in
  ``features`` kept (unindented), the rest dropped, and the flags' definition gone."""
  return cst.parse_module(_body()).visit(_Decided(features)).code


class _Decided(cst.CSTTransformer):
  """Decides each flag test: ``on`` names the flags whose code stays."""

  def __init__(self, on: frozenset[str]) -> None:
    super().__init__()
    self.on = on

  @staticmethod
  def _flag(test: cst.BaseExpression) -> str | None:
    return test.value if isinstance(test, cst.Name) and test.value in FEATURES else None

  def leave_If(self, original_node: cst.If, updated_node: cst.If
               ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement] | cst.RemovalSentinel:
    test = updated_node.test
    rest: cst.BaseExpression | None = None
    if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
      rest = test.right  # ``if FLAG and x:``
      test = test.left
    flag = self._flag(test)
    if flag is None:
      return updated_node
    if flag in self.on and rest is not None:
      return updated_node.with_changes(test=rest)
    block = (updated_node.body if flag in self.on
             else updated_node.orelse.body if isinstance(updated_node.orelse, cst.Else)
             else None)
    if block is None:
      return cst.RemoveFromParent()
    chosen: list[cst.BaseStatement] = []
    for stmt in block.body:  # the if's comments go with its first statement
      assert isinstance(stmt, (cst.SimpleStatementLine, cst.BaseCompoundStatement))
      lines = [*updated_node.leading_lines, *stmt.leading_lines] if not chosen else []
      chosen.append(stmt.with_changes(leading_lines=lines or stmt.leading_lines))
    return cst.FlattenSentinel(chosen)

  def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp
                  ) -> cst.BaseExpression:
    flag = self._flag(updated_node.test)
    if flag is None:
      return updated_node
    return updated_node.body if flag in self.on else updated_node.orelse

  def leave_SimpleStatementLine(
      self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
  ) -> cst.SimpleStatementLine | cst.RemovalSentinel:
    first = updated_node.body[0]
    if isinstance(first, cst.Assign) and all(self._flag(t.target) for t in first.targets):
      return cst.RemoveFromParent()  # the flags' definition
    return updated_node

  def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef
                        ) -> cst.FunctionDef:
    """Drops a parameter with a default that only dropped code read."""
    if updated_node.deep_equals(original_node):
      return updated_node
    read = {n.value for n in _names_in(updated_node.body)}
    params = updated_node.params
    kept = [p for p in params.params if p.default is None or p.name.value in read]
    named = [p for p in params.kwonly_params if p.default is None or p.name.value in read]
    if len(kept) + len(named) == len(params.params) + len(params.kwonly_params):
      return updated_node
    star = params.star_arg
    if not named and isinstance(star, cst.ParamStar):
      star = cst.MaybeSentinel.DEFAULT  # a bare * needs a parameter after it
    last = named or (kept if isinstance(star, cst.MaybeSentinel) else [])
    if last:  # no comma after the last parameter
      last[-1] = last[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return updated_node.with_changes(params=params.with_changes(
        params=kept, star_arg=star, kwonly_params=named))


def _names_in(node: cst.CSTNode) -> list[cst.Name]:
  found: list[cst.Name] = []

  class Names(cst.CSTVisitor):
    def visit_Name(self, name: cst.Name) -> None:
      found.append(name)

  node.visit(Names())
  return found


def source(names: Collection[str] | None = None) -> str:
  """The module's text, header included: all of it, or what ``names`` need."""
  text = body(names)
  return _HEADER.format(version=VERSION, digest=_tree_digest_cached(text)) + text


@functools.lru_cache(maxsize=16)
def statements(text: str | None = None) -> list[tuple[ast.stmt, str]]:
  """The top-level statements of ``text`` (the support source with every flag's code
  by default), each with its text (the comment lines right above it included)."""
  text = resolved(FEATURES) if text is None else text
  tree = ast.parse(text)
  lines = text.splitlines(keepends=True)
  out = []
  previous_end = 0
  for stmt in tree.body:
    start = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])]) - 1
    first = start
    while first > previous_end and lines[first - 1].lstrip().startswith("#"):
      first -= 1
    assert stmt.end_lineno is not None
    out.append((stmt, "".join(lines[first:stmt.end_lineno])))
    previous_end = stmt.end_lineno
  return out


def defined(stmt: ast.stmt) -> set[str]:
  """The names a top-level statement binds."""
  if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
    return {stmt.name}
  if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
    return {t.id for t in targets if isinstance(t, ast.Name)}
  if isinstance(stmt, (ast.Import, ast.ImportFrom)):
    return {(a.asname or a.name).split(".")[0] for a in stmt.names}
  return set()


def used(node: ast.AST) -> set[str]:
  return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def needed(names: Collection[str], text: str | None = None) -> list[tuple[ast.stmt, str]]:
  """The definitions (not the imports) of ``text`` (see ``statements``) that ``names``
  need: theirs and those they use, in the source's order."""
  definitions = [(stmt, code) for stmt, code in statements(text)
                 if not isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Expr))]
  wanted = set(names)
  while True:
    reads = set().union(*(used(s) for s, _ in definitions if defined(s) & wanted))
    grown = wanted | {n for s, _ in definitions for n in defined(s) & reads}
    if grown == wanted:
      return [(s, t) for s, t in definitions if defined(s) & wanted]
    wanted = grown


@functools.lru_cache(maxsize=64)
def cut(names: frozenset[str]) -> str:
  """The module for files that call the functions among ``names`` with the flags among
  them: its docstring, the imports the kept definitions read, and those definitions."""
  features = _with_always(names) & FEATURES
  text = resolved(frozenset(features))
  kept = needed(names - FEATURES, text)
  reads = set().union(*(used(s) for s, _ in kept))
  every = statements(text)
  docstring = [text.strip("\n") for stmt, text in every[:1] if isinstance(stmt, ast.Expr)]
  imports = [text for stmt, text in every
             if isinstance(stmt, (ast.Import, ast.ImportFrom)) and defined(stmt) & reads]
  head = "\n".join([*docstring, _import_groups(imports)])
  # After the imports, isort's (and ruff's) default: two blank lines before a def or a
  # class, else one.
  gap = "\n\n" if kept and isinstance(kept[0][0], (ast.FunctionDef, ast.ClassDef)) else "\n"
  return head + gap + "\n\n\n".join(t.strip("\n") for _, t in kept) + "\n"


def _with_always(names: frozenset[str]) -> frozenset[str]:
  return names.union(*(_ALWAYS_WITH.get(name, ()) for name in names))


def spaced_after_imports(text: str, lines: int) -> str:
  """``text`` with ``lines`` blank lines after its import block, where the repository's
  sorter sets a number (``lines-after-imports``: ``lines`` >= 0)."""
  if lines < 0:
    return text
  ends = [s.end_lineno for s in ast.parse(text).body if isinstance(s, (ast.Import, ast.ImportFrom))]
  if not ends or ends[-1] is None:
    return text
  split = text.splitlines(keepends=True)
  return "".join(split[:ends[-1]]) + "\n" * lines + "".join(split[ends[-1]:]).lstrip("\n")


def _import_groups(imports: list[str]) -> str:
  """The kept import lines, standard library first, a blank line before third-party."""
  std = [i for i in imports if i.split()[1].split(".")[0] not in ("jax", "numpy")]
  third = [i for i in imports if i not in std]
  return "".join(std) + ("\n" if std and third else "") + "".join(third)


def held(text: str) -> frozenset[str]:
  """The public functions a support module's text defines."""
  try:
    tree = ast.parse(text)
  except (SyntaxError, ValueError):
    return frozenset()
  return frozenset(name for stmt in tree.body for name in defined(stmt)
                   if isinstance(stmt, ast.FunctionDef) and not name.startswith("_"))


def held_with_flags(text: str) -> frozenset[str] | None:
  """The public functions a support module body of this version defines, and the flags
  whose code it holds; None for a body this version does not write (an older one's, or
  one edited since)."""
  has = held(text)
  digest = tree_digest(text)
  if digest == _tree_digest_cached(body()):
    return has | FEATURES
  for n in range(len(FEATURES) + 1):
    for flags in itertools.combinations(sorted(FEATURES), n):
      if digest == _tree_digest_cached(cut(has | frozenset(flags))):
        return _with_always(has | frozenset(flags))
  return None


def tree_digest(text: str) -> str | None:
  """sha256 (24 hex digits) of ``text``'s syntax tree in a canonical form; None if it
  does not parse. Formatting (indentation, quotes, line wrapping, trailing commas,
  parentheses, blank lines, comments) leaves the tree as it is; docstrings are left
  out too, since formatters reindent them and ruff's docstring-code-format rewrites
  the code in them. The form is the same on every Python version (ast.dump's is not:
  3.13 leaves out empty fields, 3.12 added type_params)."""
  try:
    tree = ast.parse(text)
  except (SyntaxError, ValueError):
    return None
  return hashlib.sha256(_canonical(tree).encode("utf-8")).hexdigest()[:24]


_tree_digest_cached = functools.lru_cache(maxsize=32)(tree_digest)


def _canonical(node: object) -> str:
  if isinstance(node, list):
    return "[" + ",".join(_canonical(item) for item in node if not _is_docstring(item)) + "]"
  if not isinstance(node, ast.AST):
    return repr(node)
  fields = []
  for name, value in ast.iter_fields(node):
    # Fields a Python version adds are empty where older ones lack them; ``kind`` is
    # the u of u"..." and type comments are not parsed by default.
    if value is None or value == [] or name in ("kind", "type_comment"):
      continue
    if isinstance(node, ast.JoinedStr) and name == "values":
      value = _literals_merged(value)
    fields.append(f"{name}={_canonical(value)}")
  return f"{type(node).__name__}({','.join(fields)})"


def _literals_merged(parts: list[ast.expr]) -> list[ast.expr]:
  """An f-string's parts with adjacent literal ones merged and empty ones dropped:
  ``f"a{x}" "b"`` (which a formatter may join) is ``f"a{x}b"``."""
  out: list[ast.expr] = []
  for part in parts:
    if isinstance(part, ast.Constant) and isinstance(part.value, str):
      last = out[-1] if out else None
      if isinstance(last, ast.Constant) and isinstance(last.value, str):
        out[-1] = ast.Constant(last.value + part.value)
      elif part.value:
        out.append(part)
    else:
      out.append(part)
  return out


def _is_docstring(node: object) -> bool:
  """A statement that is just a string: a docstring (or a string that does nothing)."""
  return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
          and isinstance(node.value.value, str))


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


def placement(path: str, text: str, run_names: Mapping[str, str] | None = None) -> Placement:
  """The support module a file at ``path`` imports: inside its top-level package when it
  is in one (an installed package ships it), else ``pmap_shard_map`` next to the script,
  where Python finds it when the script runs (``python main.py`` puts the script's
  directory on sys.path, whatever the working directory). The file imports it the way it
  imports its own package or directory: relatively if it uses relative imports, through
  the directories above them if its imports go through those (haiku's
  ``examples/imagenet/train.py`` imports ``examples.imagenet.dataset``), else, for a
  module that is no script, as the run's other files import modules of its directory
  (``run_names``, from ``run_names_of``: a namespace package's module that others import
  as ``pkg.c``; a script run as ``python main.py`` finds only its own directory)."""
  package = package_of(path)
  if package is None or not all(part.isidentifier() for part in package[1]):
    directory = os.path.dirname(os.path.abspath(path))
    # A directory without __init__.py inside a package's tree (jraph/experimental), or a
    # test outside packages, whose files import that package: the package's copy.
    owner = _enclosing_package(directory, text)
    through = None
    if owner is None:
      through = _imported_as(text, directory) or (
          None if _MAIN_GUARD.search(text) else (run_names or {}).get(directory))
      if through is None:
        owner = _tested_package(path, text)
    if owner is not None:
      root, top = owner
      return Placement(root, f"{top}.{PACKAGE_NAME}", f"{top}.{PACKAGE_NAME}")
    return Placement(directory, DEFAULT_NAME,
                     DEFAULT_NAME if through is None else f"{through}.{DEFAULT_NAME}")
  root, parts = package
  name = f"{parts[0]}.{PACKAGE_NAME}"
  if _RELATIVE_IMPORT.search(text):
    return Placement(root, name, "." * len(parts) + PACKAGE_NAME)
  through = _imported_as(text, os.path.join(root, parts[0]))
  return Placement(root, name, f"{through or parts[0]}.{PACKAGE_NAME}")


_TEST_FILE = re.compile(r"(^test_.*|.*_test|.*_tests|^conftest)\.py$")
_TEST_DIRECTORIES = frozenset({"test", "tests"})
_TOP_LEVEL_IMPORTS = re.compile(r"^(?:from|import)[ \t]+(\w+)", re.M)


def _enclosing_package(directory: str, text: str) -> tuple[str, str] | None:
  """(directory holding it, name) of the top-level package whose tree holds
  ``directory`` (a directory without __init__.py), where ``text`` imports it by name."""
  here = directory
  while not os.path.isfile(os.path.join(here, "__init__.py")):
    parent = os.path.dirname(here)
    if parent == here or config_files.is_root(here):
      return None
    here = parent
  package = package_of(os.path.join(here, "__init__.py"))
  if package is None:
    return None
  root, parts = package
  return (root, parts[0]) if parts[0] in _TOP_LEVEL_IMPORTS.findall(text) else None


def _tested_package(path: str, text: str) -> tuple[str, str] | None:
  """(directory holding it, name) of the first package of the file's repository that a
  test file outside packages imports (kfac-jax's ``tests/test_utils.py`` imports
  ``kfac_jax``); None for other files."""
  parts = os.path.abspath(path).split(os.sep)
  if not (_TEST_FILE.match(parts[-1]) or _TEST_DIRECTORIES & set(parts[:-1])):
    return None
  start = os.path.dirname(os.path.abspath(path))
  for top in dict.fromkeys(_TOP_LEVEL_IMPORTS.findall(text)):
    for directory in config_files.directories(start):
      for root in (directory, os.path.join(directory, "src")):
        if os.path.isfile(os.path.join(root, top, "__init__.py")):
          return root, top
  return None


_MAIN_GUARD = re.compile(r"^if\s+__name__\s*==\s*['\"]__main__['\"]\s*:", re.M)


def run_names_of(sources: Iterable[tuple[str, str]]) -> dict[str, str]:
  """For each directory outside any package among the (path, text) ``sources`` of a run:
  the dotted name by which their texts import modules there, where they do
  (``_imported_as``) and no file there imports a neighbour by its bare name, as a script
  directory's files do (flax's ``examples/imagenet``: ``import models``)."""
  sources = list(sources)
  joined = "\n".join(text for _, text in sources)
  by_directory: dict[str, list[str]] = {}
  for path, text in sources:
    if package_of(path) is None:
      by_directory.setdefault(os.path.dirname(os.path.abspath(path)), []).append(text)
  found = {}
  for directory, texts in sorted(by_directory.items()):
    if any(os.path.isfile(os.path.join(directory, top + ".py"))
           for text in texts for top in _TOP_LEVEL_IMPORTS.findall(text)):
      continue
    if (name := _imported_as(joined, directory)) is not None:
      found[directory] = name
  return found


def _imported_as(text: str, directory: str) -> str | None:
  """The dotted name by which the file's imports reach modules in ``directory``: the
  directory's name, or that under the names of the directories above it; None where no
  import of the file names a module that is there."""
  names: list[str] = []
  here = directory
  while True:
    parent, name = os.path.split(here)
    # Not through the repository's own directory: its parent is no place Python looks.
    if not name.isidentifier() or config_files.is_root(here):
      return None
    names.insert(0, name)
    dotted = ".".join(names)
    if any(os.path.isfile(os.path.join(directory, module + ".py"))
           or os.path.isdir(os.path.join(directory, module))
           for module in _imported_from(text, dotted)):
      return dotted
    here = parent


def _imported_from(text: str, dotted: str) -> list[str]:
  """The first names below ``dotted`` that the imports in ``text`` name: ``from dotted
  import a`` and ``import dotted.a`` and ``from dotted.a import b`` give ``a``."""
  prefix = re.escape(dotted)
  below = re.findall(rf"^[ \t]*(?:from|import)[ \t]+{prefix}\.(\w+)", text, re.M)
  direct = re.findall(rf"^[ \t]*from[ \t]+{prefix}[ \t]+import[ \t(]+(\w+)", text, re.M)
  return below + direct


class Status(enum.Enum):
  MISSING = "missing"
  CURRENT = "current"  # this version, unedited
  STALE = "stale"      # written by an earlier version of the codemod, unedited
  FOREIGN = "foreign"  # not written by the codemod, or edited since


def status_of(text: str | None, names: Collection[str] = ()) -> Status:
  """How a support module's text stands for files that call ``names``: CURRENT when it
  is this version's text (as written, or reformatted) and holds them all."""
  if text is None:
    return Status.MISSING
  first, _, body_text = text.partition("\n")
  first = first.rstrip()  # a CRLF file's \r
  old = _OLD_HEADER_RE.fullmatch(first)
  if old:
    # An older copy as written (its text's hash), or rewritten by a formatter.
    if (hashlib.sha256(body_text.encode("utf-8")).hexdigest() == old.group(2)
        or _tree_digest_cached(body_text) in _V2_TREE_DIGESTS):
      return Status.STALE
    return Status.FOREIGN
  match = _HEADER_RE.fullmatch(first)
  if not match:
    return Status.FOREIGN
  # (version, digest): the header's groups (v9 on; v6-v8 said "Do not edit"; v3-v5 were a
  # comment)
  version, digest = next(match.group(i, i + 1) for i in (1, 3, 5) if match.group(i))
  if _tree_digest_cached(body_text) != digest:
    return Status.FOREIGN
  has = held_with_flags(body_text)
  if int(version) == VERSION and has is not None and has >= set(names):
    return Status.CURRENT  # possibly reformatted: left as the repository's formatter made it
  return Status.STALE


def is_support_module(text: str) -> bool:
  """Whether ``text`` starts with the header a written support module has."""
  return _HEADER_RE.match(text) is not None or _OLD_HEADER_RE.match(text) is not None


def path_for(root: str, name: str) -> str:
  """Where module ``name`` (dotted) lives under the directory ``root``."""
  if not name or not all(part.isidentifier() for part in name.split(".")):
    raise ValueError(f"--support-module must be a dotted module name, got {name!r}")
  return os.path.join(root, *name.split(".")) + ".py"


def copy_for(path: str, name: str, relative: int) -> tuple[str, str] | None:
  """(root, dotted name) of the copy of the support module that a file at ``path``
  imports as ``name`` after ``relative`` leading dots: in the file's package for a
  relative import, else in the file's directory or the nearest one above it that holds
  it (where Python finds it when the file runs); None where there is no such file."""
  if relative:
    package = package_of(path)
    if package is None or relative > len(package[1]):
      return None
    root, parts = package
    dotted = ".".join([*parts[:len(parts) - (relative - 1)], name])
    return (root, dotted) if os.path.isfile(path_for(root, dotted)) else None
  directory = os.path.dirname(os.path.abspath(path))
  while not os.path.isfile(path_for(directory, name)):
    parent = os.path.dirname(directory)
    if parent == directory:
      return None
    directory = parent
  return directory, name


def read(root: str, name: str) -> str | None:
  path = path_for(root, name)
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8", newline="") as f:
    return f.read()


def status_at(root: str, name: str, names: Collection[str] = ()) -> Status:
  return status_of(read(root, name), names)


def foreign_message(root: str, name: str) -> str:
  return (f"{path_for(root, name)} exists but was not written by pmap-to-shmap (or was edited "
          f"since), so the converted files cannot import {name} from it; choose another "
          "name with --support-module")


def write(root: str, name: str, names: Collection[str] | None = None,
          layout: Callable[[str], str] | None = None) -> bool:
  """Writes the module under ``root`` for files that call ``names`` (None: all of it),
  keeping what a copy there holds, unless an up-to-date copy is there; True if written.
  ``layout`` takes the module's text to the text written (the repository's formatter).

  Raises ``FileExistsError`` for a foreign file (never overwritten).
  """
  text = read(root, name)
  status = status_of(text, names or ())
  if status is Status.FOREIGN:
    raise FileExistsError(foreign_message(root, name))
  if status is Status.CURRENT:
    return False
  path = path_for(root, name)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  written = source(wanted(text, names))
  files.write_atomically(path, (layout(written) if layout else written).encode("utf-8"))
  return True


def wanted(text: str | None, names: Collection[str] | None) -> frozenset[str] | None:
  """What a module written over ``text`` (ours, or None) must hold for ``names``."""
  if names is None:
    return None
  if text is None:
    return frozenset(names)
  body_text = text.partition("\n")[2]
  # An older version's copy served its files with every flag's code.
  return frozenset(names) | (held_with_flags(body_text) or held(body_text) | FEATURES)


def taken(get_metadata: Callable, node: cst.CSTNode, names: Iterable[str]) -> list[str]:
  """The ``names`` (support functions) that the scope at ``node`` binds to something else
  (the file's own def, a parameter): an import of ours would not reach code there, or
  would hide the file's."""
  scope = get_metadata(ScopeProvider, node, None)
  return [name for name in names if scope is not None and name in scope
          and not all(map(is_import_of_support, scope[name]))]


def is_import_of_support(assignment) -> bool:
  """Whether a scope binding (libcst Assignment) was made by importing a support module
  (as in a rerun over converted code), so a rewrite may use the name it binds."""
  node = getattr(assignment, "node", None)
  if not isinstance(node, cst.ImportFrom) or node.module is None:
    return False
  return cst.Module([]).code_for_node(node.module).rsplit(".", 1)[-1].endswith("pmap_shard_map")
