"""The imports a converted file gets: only those its new code uses that the file does not
bind yet, placed where the file keeps its own.

A name the file already binds at module level (say ``import jax`` in a later notebook
cell, or after a setup statement) is not imported again: a second import would shadow an
unused first one (ruff F811). A name the new code does not use is not imported (F401).
New imports go into the run of import statements that holds the file's own ``jax``
import (a notebook's import cell), else the leading one, each into its isort section
(``__future__``, standard library, third party, first party, relative) as ruff's I001
orders them: at its sorted place where the file's section is sorted (ruff's default or
``force-sort-within-sections``), else after the section's last import of the same
package, or its last statement; a section the file lacks is started between its
neighbours. Support names join an existing import of
the support module.
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from codemod import site_comments
from codemod.file_style import FileStyle
from codemod.import_style import ImportStyle


@dataclass(frozen=True)
class Wanted:
  """One import: ``import module`` (name None) or ``from module import name [as alias]``."""
  module: str
  name: str | None = None
  alias: str | None = None
  relative: int = 0  # leading dots of a relative ``from`` import

  @property
  def bound(self) -> str:
    """The name the import binds in the module."""
    return self.alias or self.name or self.module.split(".")[0]

  @property
  def qualified(self) -> str:
    return self.module if self.name is None else f"{self.module}.{self.name}"

  def code(self) -> str:
    if self.name is None:
      return f"import {self.module}"
    alias = f" as {self.alias}" if self.alias else ""
    return f"from {'.' * self.relative}{self.module} import {self.name}{alias}"


def uses(text: str, name: str) -> bool:
  """Whether ``text`` (new code) refers to the top-level ``name`` (``P(``, ``jax.``)."""
  return re.search(rf"(?<![\w.]){re.escape(name)}\b", text) is not None


def binds(scope, wanted: Wanted) -> bool:
  """Whether the module scope already binds ``wanted.bound`` to what it would import."""
  if scope is None or wanted.bound not in scope:
    return False
  names = {q.name for q in scope.get_qualified_names_for(wanted.bound)}
  if wanted.relative:
    return any(n.endswith(f".{wanted.name}") or n == wanted.name for n in names)
  return wanted.qualified in names or (
      wanted.name is None and any(n.startswith(wanted.module + ".") for n in names))


def _import_of(stmt: cst.CSTNode) -> cst.Import | cst.ImportFrom | None:
  if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(
      stmt.body[0], (cst.Import, cst.ImportFrom)):
    return stmt.body[0]
  return None


def _module_of(node: cst.Import | cst.ImportFrom) -> list[str]:
  code = cst.Module([]).code_for_node
  if isinstance(node, cst.Import):
    return [code(a.name) for a in node.names]
  return ["." * len(node.relative) + (code(node.module) if node.module else "")]


def _is_jax_import(node: cst.Import | cst.ImportFrom) -> bool:
  return any(m == "jax" or m.startswith("jax.") for m in _module_of(node))


def _skips_first(body: list) -> bool:
  """A docstring (or ``__strict__``) stays first, as AddImportsVisitor keeps it."""
  if not body or not isinstance(body[0], cst.SimpleStatementLine):
    return False
  first = body[0].body[0]
  return (isinstance(first, cst.Expr) and isinstance(first.value, (cst.SimpleString,
                                                                   cst.ConcatenatedString))
          or isinstance(first, cst.Assign) and isinstance(first.targets[0].target, cst.Name)
          and first.targets[0].target.value == "__strict__")


# isort's sections, in file order.
FUTURE, STDLIB, THIRD_PARTY, FIRST_PARTY, LOCAL = range(5)
# notebook.py's cell markers and masked IPython lines: boundaries, not comments of the
# statement below them, so an import put before that statement goes below them.
PINNED = re.compile(r"# pmap-to-shmap:cell \d+$|#_pmap_to_shmap_magic_")


def _pinned(stmt: cst.CSTNode) -> bool:
  return any(line.comment is not None and PINNED.match(line.comment.value)
             for line in getattr(stmt, "leading_lines", ()))


def _node(stmt: cst.CSTNode) -> cst.Import | cst.ImportFrom:
  node = _import_of(stmt)
  assert node is not None
  return node


def _run(body: list) -> tuple[int, int]:
  """The statements new imports join, ``body[start:end]``: the run of imports that holds
  the file's first jax import, else the leading run after a docstring; empty where the
  file starts with code."""
  imports = [_import_of(stmt) for stmt in body]
  start = next((i for i, node in enumerate(imports) if node is not None and _is_jax_import(node)),
               None)
  if start is not None:
    while start > 0 and imports[start - 1] is not None:
      start -= 1
  else:
    start = 1 if _skips_first(body) else 0
  end = start
  while end < len(body) and imports[end] is not None:
    end += 1
  return start, end


def _section(node: cst.Import | cst.ImportFrom, first_party: frozenset[str]) -> int:
  """The node's section by name alone; a module not known otherwise is third party."""
  if isinstance(node, cst.ImportFrom) and node.relative:
    return LOCAL
  top = _module_of(node)[0].split(".")[0]
  if top == "__future__":
    return FUTURE
  if top in first_party:
    return FIRST_PARTY
  return STDLIB if top in sys.stdlib_module_names else THIRD_PARTY


def _sections(body: list, first_party: frozenset[str]) -> list[int]:
  """The sections of ``body`` (a run of imports). isort writes one blank-line separated
  block per section, so a block of modules not known otherwise that follows a third-party
  block is the file's first party (``from mypkg import x``), and a first-party module
  inside a third-party block is third party to the file's sorter."""
  sections = [_section(_node(stmt), first_party) for stmt in body]
  starts = [i for i, stmt in enumerate(body) if i == 0 or any(
      line.comment is None for line in stmt.leading_lines)]
  seen_third = False
  for begin, stop in zip(starts, [*starts[1:], len(body)][:len(starts)], strict=True):
    block = sections[begin:stop]
    if THIRD_PARTY in block and FIRST_PARTY in block:
      sections[begin:stop] = [THIRD_PARTY if s == FIRST_PARTY else s for s in block]
      seen_third = True
    elif seen_third and all(s in (THIRD_PARTY, FIRST_PARTY) for s in block):
      sections[begin:stop] = [FIRST_PARTY] * len(block)
    elif THIRD_PARTY in block:
      seen_third = True
  return sections


def _natural(text: str) -> tuple:
  """ruff's natural order: digit runs compare as numbers (``a9`` before ``a10``)."""
  return tuple(int(part) if i % 2 else part for i, part in enumerate(re.split(r"(\d+)", text)))


def _optional(text: str | None) -> tuple:
  return () if text is None else (_natural(text),)


def _member_key(alias: cst.ImportAlias) -> tuple:
  """ruff's order of imported names: CONSTANTS, Classes, variables, case-insensitively."""
  name = alias.evaluated_name
  kind = 0 if len(name) > 1 and name.isupper() else 1 if name[:1].isupper() else 2
  return (1, kind, _natural(name.lower()), _natural(name), _optional(alias.evaluated_alias))


def _key(node: cst.Import | cst.ImportFrom, force_sort: bool) -> tuple:
  """ruff's isort key of a statement within its section: by module name, case-insensitively,
  ``import m`` before ``from m import x`` unless ``force-sort-within-sections``."""
  if isinstance(node, cst.Import):
    alias = node.names[0]
    name = alias.evaluated_name
    key: tuple = (0, _natural(name.lower()), _natural(name), (),
                  _optional(alias.evaluated_alias))
  else:
    name = _module_of(node)[0].lstrip(".")
    first = ((0,) if isinstance(node.names, cst.ImportStar)
             else min(_member_key(alias) for alias in node.names))
    key = (-len(node.relative), _natural(name.lower()), _natural(name), (first,), ())
  return key if force_sort else (isinstance(node, cst.ImportFrom), *key)


def _is_sorted(keys: list[tuple]) -> bool:
  return all(a <= b for a, b in zip(keys, keys[1:], strict=False))


def _force_sorted(nodes: list, sections: list[int]) -> bool:
  """Whether the file sorts ``import m`` and ``from m import x`` together (Google style):
  some section is sorted only that way."""
  votes = 0
  for section in set(sections):
    members = [node for node, s in zip(nodes, sections, strict=True) if s == section]
    plain = _is_sorted([_key(node, False) for node in members])
    force = _is_sorted([_key(node, True) for node in members])
    votes += force - plain
  return votes > 0


def _blank_first(lines: list) -> list:
  """``lines`` starting with a blank line (a new section's separation)."""
  return lines if lines and lines[0].comment is None else [cst.EmptyLine(), *lines]


def _split_leading(stmt: cst.CSTNode) -> tuple[list, list]:
  """An import's leading lines as (what goes above a statement inserted before it: pinned
  markers and blank lines, what stays with it: its comments)."""
  lines = list(getattr(stmt, "leading_lines", ()))
  pinned = max((i + 1 for i, line in enumerate(lines)
                if line.comment is not None and PINNED.match(line.comment.value)), default=0)
  blanks = pinned
  while blanks < len(lines) and lines[blanks].comment is None:
    blanks += 1
  return lines[:blanks], lines[blanks:]


def _placed(body: list, statements: list, first_party: frozenset[str],
            force_sort: bool | None) -> list:
  """``body`` with the new import ``statements`` placed in their sections (see the module
  docstring); ``force_sort``: the configured ``force-sort-within-sections``, None where
  the file's order tells."""
  start, end = _run(body)
  # In a notebook, the run's last cell: where the new imports went before they were grouped,
  # and ruff sorts each cell by itself.
  start = max((i for i in range(start, end) if _pinned(body[i])), default=start)
  nodes = [_node(stmt) for stmt in body[start:end]]
  sections = _sections(body[start:end], first_party)
  if force_sort is None:
    force_sort = _force_sorted(nodes, sections)
  by_top: dict[str, int] = {}
  for node, section in zip(nodes, sections, strict=True):
    if section not in (FUTURE, LOCAL):
      for module in _module_of(node):
        by_top.setdefault(module.split(".")[0], section)
  new = []
  for stmt in statements:
    node = _node(stmt)
    section = _section(node, first_party)
    if section != LOCAL:  # a module the run imports already (jax) joins that import's section
      section = by_top.get(_module_of(node)[0].split(".")[0], section)
    new.append((section, _key(node, force_sort), stmt, node))
  for section, key, stmt, node in sorted(new, key=lambda item: item[:2]):
    members = [i for i, s in enumerate(sections) if s == section]
    lower = [i for i, s in enumerate(sections) if s < section]
    higher = [i for i, s in enumerate(sections) if s > section]
    if members:
      keys = [_key(nodes[i], force_sort) for i in members]
      after = next((i for i, k in zip(members, keys, strict=True) if k > key), None)
      if after is None or not _is_sorted(keys):
        # after the section's last statement; in an unsorted one, after its last import of
        # the same package (``from jax import random``), where it has one
        top = _module_of(node)[0].split(".")[0]
        same = [i for i in members if top in {m.split(".")[0] for m in _module_of(nodes[i])}]
        at = (same[-1] if same and not _is_sorted(keys) else members[-1]) + 1
      else:
        at = after
        top = _module_of(node)[0].split(".")[0]
        following = body[start + at]
        starts_block = any(line.comment is None for line in following.leading_lines)
        if not (starts_block and at > 0 and top in {
            m.split(".")[0] for m in _module_of(nodes[at - 1])}):
          above, kept = _split_leading(following)
          stmt = stmt.with_changes(leading_lines=above)
          if kept and (above or at == 0):
            kept = _blank_first(kept)
          body[start + at] = following.with_changes(leading_lines=kept)
        # else: the blank-line-separated block above imports the same package: the new
        # import ends that block, and the blank line stays before the next one.
    elif lower:
      at = max(lower) + 1  # a new section after those before it in isort's order
      stmt = stmt.with_changes(leading_lines=[cst.EmptyLine()])
      if at < len(nodes):
        following = body[start + at]
        body[start + at] = following.with_changes(
            leading_lines=_blank_first(list(following.leading_lines)))
    elif higher:
      at = min(higher)  # a new section before those after it
      above, kept = _split_leading(body[start + at])
      stmt = stmt.with_changes(leading_lines=above)
      body[start + at] = body[start + at].with_changes(leading_lines=_blank_first(kept))
    else:
      at = 0
      if start < len(body):
        # Imports where there were none: a blank line before the code that follows.
        following = body[start]
        if not any(line.comment is None for line in getattr(following, "leading_lines", ())):
          body[start] = following.with_changes(
              leading_lines=[cst.EmptyLine(), *following.leading_lines])
    body.insert(start + at, stmt)
    nodes.insert(at, node)
    sections.insert(at, section)
  return body


def add(module: cst.Module, wanted: list[Wanted], width: int = 10_000,
        first_party: frozenset[str] = frozenset(), style: ImportStyle | None = None,
        here: str | None = None) -> cst.Module:
  """``module`` with the ``wanted`` imports: names from a module it already imports with
  ``from`` join that statement, the rest are new statements placed in their sections (see
  the module docstring); a ``from`` import longer than ``width`` continues in parentheses,
  names aligned. ``first_party`` names the top-level modules of the file's own project,
  besides the support module (a wanted import neither jax nor standard library).
  ``style``: the repository's configured sorting (``import_style``), which decides over
  the file's order and over where the support module's import goes (a top-level one,
  written in ``here``, the file's directory, is first party only where the sorter finds
  it so); with ``force_single_line``, or where no sorter is configured and the file writes
  one name per ``from`` import, each name gets its own statement."""
  single = style.force_single_line if style is not None else _one_name_per_from(module.body)
  if style is not None:
    first_party = first_party | style.known_first_party
  body = list(module.body)
  merged: set[Wanted] = set()
  for i, stmt in enumerate(body):
    node = _import_of(stmt)
    if single or not isinstance(node, cst.ImportFrom) or isinstance(node.names, cst.ImportStar):
      continue
    joining = [w for w in wanted if w.name is not None and w.alias is None and w not in merged
               and _module_of(node)[0] == "." * w.relative + w.module]
    if not joining:
      continue
    names = sorted({a.evaluated_name for a in node.names} | {w.name for w in joining
                                                            if w.name is not None})
    if any(a.asname is not None for a in node.names):
      continue  # an aliased import stays as written; the names get their own statement
    joined = node.with_changes(names=[cst.ImportAlias(cst.Name(n)) for n in names],
                               lpar=None, rpar=None)
    code = cst.Module([]).code_for_node(joined)
    if len(code) > width:
      line = cst.ensure_type(cst.parse_statement(_wrapped(code, width)), cst.SimpleStatementLine)
      joined = cst.ensure_type(line.body[0], cst.ImportFrom)
    body[i] = stmt.with_changes(body=[joined])
    merged.update(joining)
  new = [w for w in wanted if w not in merged]
  if not new:
    return module.with_changes(body=body)
  order = ([w for w in new if w.name is None] + [w for w in new if w.alias is not None]
           + [w for w in new if w.name is not None and w.alias is None])
  statements = [cst.parse_statement(_wrapped(w.code(), width), config=module.config_for_parsing)
                for w in (list(dict.fromkeys(order)) if single else _grouped(order))]
  support = {w.module for w in wanted if w.name and not w.relative
             and w.module.split(".")[0] not in {"jax", *sys.stdlib_module_names}}
  # A support module inside the file's own package is first party (ruff's
  # detect-same-package); a top-level one, written in ``here``, where the sorter finds it.
  first_party = first_party | {
      module.split(".")[0] for module in support
      if style is None or "." in module or style.first_party(module, here)}
  force_sort = None if style is None else style.force_sort_within_sections
  return module.with_changes(body=_placed(body, statements, first_party, force_sort))


def add_to_file(module: cst.Module, wanted: list[Wanted], style: FileStyle,
                path: str | None) -> cst.Module:
  """``add`` in the layout of the file at ``path`` (its limit and configured sorting; a
  top-level support module is looked for in the file's directory)."""
  return add(module, wanted, style.width, style=style.imports,
             here=os.path.dirname(os.path.abspath(path)) if path else None)


def without(module: cst.Module, sources: tuple[str, ...], names: set) -> cst.Module:
  """``module`` without its top-level ``from SOURCE import NAME`` of ``names`` (unaliased),
  a statement left empty removed; statements holding comments stay as written."""
  if not names:
    return module
  body = []
  for stmt in module.body:
    node = _import_of(stmt)
    if (isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar)
        and _module_of(node)[0] in sources and not site_comments.comments_in(stmt)):
      kept = [a for a in node.names if a.asname is not None or a.evaluated_name not in names]
      if len(kept) != len(node.names):
        if not kept:
          continue
        kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        stmt = stmt.with_changes(body=[node.with_changes(names=kept)])
    body.append(stmt)
  return module.with_changes(body=body)


_TYPING_MODULES = frozenset({"typing", "typing_extensions", "collections.abc"})


def _one_name_per_from(body: Sequence[cst.CSTNode]) -> bool:
  """Whether the file imports several names from one module one ``from`` statement each
  (``from absl import app`` / ``from absl import flags``), and never two in one (but from
  the typing modules, which Google's style exempts)."""
  seen: set[str] = set()
  repeated = False
  for stmt in body:
    node = _import_of(stmt)
    if isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
      module = _module_of(node)[0]
      if module in _TYPING_MODULES:
        continue
      if len(node.names) > 1:
        return False
      repeated = repeated or module in seen
      seen.add(module)
  return repeated


def _wrapped(code: str, width: int) -> str:
  """``from m import a, b, c`` as one line if it fits in ``width``, else in parentheses
  with the names packed onto lines aligned after the opening one."""
  head, sep, names = code.partition(" import ")
  if len(code) <= width or not sep or "," not in names:
    return code
  first = f"{head} import ("
  lines, line = [], first
  items = [n.strip() for n in names.split(",")]
  for i, name in enumerate(items):
    piece = name + (")" if i == len(items) - 1 else ",")
    if line not in (first, " " * len(first)) and len(line) + 1 + len(piece) > width:
      lines.append(line)
      line = " " * len(first)
    line += piece if line in (first, " " * len(first)) else " " + piece
  lines.append(line)
  return "\n".join(lines)


def _grouped(order: list[Wanted]) -> list[Wanted]:
  """One ``from m import a, b`` per module (names sorted), ``import m`` sorted."""
  plain = sorted({w.module for w in order if w.name is None})
  out = [Wanted(m) for m in plain]
  seen: dict[tuple, list[str]] = {}
  aliased = []
  for w in order:
    if w.name is None:
      continue
    if w.alias is not None:
      aliased.append(w)
    else:
      seen.setdefault((w.module, w.relative), []).append(w.name)
  out += aliased
  for (module, relative), names in seen.items():
    out.append(Wanted(module, ", ".join(sorted(set(names))), None, relative))
  return out
