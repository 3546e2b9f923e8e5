"""The imports a converted file gets: only those its new code uses that the file does not
bind yet, placed where the file keeps its own.

A name the file already binds at module level (say ``import jax`` in a later notebook
cell, or after a setup statement) is not imported again: a second import would shadow an
unused first one (ruff F811). A name the new code does not use is not imported (F401).
New imports go after the import block that holds the file's own ``jax`` import (a
notebook's import cell), else after the leading import block, as libcst's
AddImportsVisitor places them; support names join an existing import of the support
module.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import libcst as cst

from codemod import site_comments


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


def insertion_index(body: list) -> int:
  """Where new imports go in a module body: after the run of imports that holds the
  file's first jax import, else after the leading run of imports."""
  imports = [_import_of(stmt) for stmt in body]
  start = next((i for i, node in enumerate(imports) if node is not None and _is_jax_import(node)),
               None)
  if start is None:
    start = 1 if _skips_first(body) else 0
    while start < len(body):
      node = imports[start]
      if not isinstance(node, cst.ImportFrom) or _module_of(node)[0] != "__future__":
        break
      start += 1
  end = start
  while end < len(body) and imports[end] is not None:
    end += 1
  return end


def add(module: cst.Module, wanted: list[Wanted], width: int = 10_000) -> cst.Module:
  """``module`` with the ``wanted`` imports: names from a module it already imports with
  ``from`` join that statement, the rest are new statements at ``insertion_index``; a
  ``from`` import longer than ``width`` continues in parentheses, names aligned."""
  body = list(module.body)
  merged: set[Wanted] = set()
  for i, stmt in enumerate(body):
    node = _import_of(stmt)
    if not isinstance(node, cst.ImportFrom) or isinstance(node.names, cst.ImportStar):
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
                for w in _grouped(order)]
  at = insertion_index(body)
  if at < len(body) and _import_of(body[at]) is None and (at == 0 or _import_of(body[at - 1])
                                                          is None):
    # Imports where there were none: a blank line before the code that follows.
    following = body[at]
    if not any(line.comment is None for line in getattr(following, "leading_lines", ())):
      body[at] = following.with_changes(
          leading_lines=[cst.EmptyLine(), *following.leading_lines])
  return module.with_changes(body=body[:at] + statements + body[at:])


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
