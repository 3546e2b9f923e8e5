"""libcst's scheduled import removals, decided without its second metadata pass.

``RemoveImportsVisitor`` (which libcst runs after a command that scheduled removals)
resolves scope and qualified-name metadata on the whole rewritten module again and walks
all of it: on a large file that costs more than the conversion itself. Most removals
are decided by what is already known, exactly as that pass would decide them:

* still used: the import has a reference on a line the rewrite leaves alone (the
  unchanged code refers to it in the new module just as in the old one), or the code the
  rewrite wrote reads the name and nothing but top-level imports binds it (so that is
  what the new reference reaches);
* unused: outside the module's top-level import statements the new code has no such
  name token and no string holding the name other than a docstring (so no reference,
  ``__all__`` entry or string annotation).

Those are applied here with the pass's own code, for names taken from a module
(``from m import n``) and for modules (``import m``) alike; anything else (a dotted module,
a name the new code may still use) is left scheduled, for libcst's pass.
"""
from __future__ import annotations

import ast
import collections
import io
import re
import tokenize
from collections.abc import Callable, Collection

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.helpers import get_absolute_module_from_package_for_import
from libcst.metadata import GlobalScope, ImportAssignment, PositionProvider, Scope

from codemod import matcher_setup

Entry = tuple[str, "str | None", "str | None"]  # (module, name, alias), as libcst schedules


def _pure_imports(stmt: cst.BaseStatement) -> bool:
  return isinstance(stmt, cst.SimpleStatementLine) and all(
      isinstance(small, (cst.Import, cst.ImportFrom)) for small in stmt.body)


def _bound_name(entry: Entry) -> str | None:
  """The name the scheduled import binds, where the entry binds one name (not the first
  part of a dotted module, which any import of that package binds too)."""
  module, name, alias = entry
  if alias is not None:
    return alias
  if name is not None:
    return name
  return None if "." in module else module


def _matches(node: cst.CSTNode, entry: Entry, package: str | None) -> bool:
  """Whether the pass would consider removing one of ``node``'s names for ``entry``."""
  if isinstance(node, cst.Import):
    return entry[1] is None and any(
        a.evaluated_name == entry[0] and a.evaluated_alias == entry[2] for a in node.names)
  if (not isinstance(node, cst.ImportFrom) or isinstance(node.names, cst.ImportStar)
      or entry[1] is None):
    return False
  if get_absolute_module_from_package_for_import(package, node) != entry[0]:
    return False
  return any(a.evaluated_name == entry[1] and a.evaluated_alias == entry[2]
             for a in node.names)


def _still_used(scopes: Collection[Scope], entry: Entry, name: str, package: str | None,
                untouched: Callable[[cst.CSTNode], bool]) -> bool:
  """Whether every import the entry names keeps a reference the rewrite leaves alone
  (libcst counts a reference to any import of the name in the import's scope)."""
  for scope in scopes:
    for assignment in scope.assignments[name]:
      if not (isinstance(assignment, ImportAssignment)
              and _matches(assignment.node, entry, package)):
        continue
      if not any(isinstance(other, ImportAssignment)
                 and any(untouched(ref.node) for ref in other.references)
                 for other in scope[name]):
        return False
  return True


def _reached_by_written(scopes: Collection[Scope], name: str, written: Collection[str]) -> bool:
  """Whether the rewrite's own code reads ``name`` (``written``: the names it reads) and
  only top-level imports bind it anywhere in the module."""
  return name in written and all(
      isinstance(scope, GlobalScope) and isinstance(assignment, ImportAssignment)
      for scope in scopes for assignment in scope.assignments[name])


def names_read(code: str) -> set[str] | None:
  """The names ``code`` (expressions the rewrite wrote, and openings such as ``f(``) reads:
  name tokens that are not an attribute (after ``.``) or a keyword argument (before
  ``=``); None where it does not tokenize."""
  tokens: list[tokenize.TokenInfo] = []
  try:
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
      if tok.type == tokenize.ERRORTOKEN:
        return None
      if tok.type not in (tokenize.NL, tokenize.COMMENT):
        tokens.append(tok)
  except tokenize.TokenError as e:
    if not e.args[0].startswith("EOF in multi-line statement"):
      return None  # an opening left open at the end is read to its end
  except (IndentationError, SyntaxError):
    return None
  return {tok.string for i, tok in enumerate(tokens)
          if tok.type == tokenize.NAME
          and not (i > 0 and tokens[i - 1].string == ".")
          and not (i + 1 < len(tokens) and tokens[i + 1].string == "=")}


def _names_in(code: str, names: set[str]) -> collections.Counter | None:
  """How often each of ``names`` is a name token in ``code``; None where a string could
  hold one as libcst's pass reads strings (``__all__`` entries, string annotations,
  f-string expressions) or the code does not tokenize. Comments and docstrings (string
  statements) hold none."""
  counts: collections.Counter = collections.Counter()
  words = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(names))) + r")\b")
  try:
    tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
  except (tokenize.TokenError, IndentationError, SyntaxError):
    return None
  statement_start = True  # no token of the current logical line yet
  for i, tok in enumerate(tokens):
    if tok.type == tokenize.NAME and tok.string in names:
      counts[tok.string] += 1
    elif tok.type == tokenize.STRING and not (statement_start and _string_statement(tokens, i)):
      prefix = tok.string[:tok.string.index(tok.string[-1])].lower()
      try:
        value = tok.string if "f" in prefix else ast.literal_eval(tok.string)
      except (ValueError, SyntaxError):
        return None
      if isinstance(value, bytes):
        value = value.decode("latin-1")
      if words.search(value):
        return None
    if tok.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
      statement_start = True
    elif tok.type not in (tokenize.NL, tokenize.COMMENT, tokenize.STRING):
      statement_start = False
  return counts


def _string_statement(tokens: list[tokenize.TokenInfo], i: int) -> bool:
  """Whether the string token ``tokens[i]``, first on its logical line, is all of it."""
  for tok in tokens[i + 1:]:
    if tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
      return True
    if tok.type not in (tokenize.STRING, tokenize.NL, tokenize.COMMENT):
      return False
  return True


class _Remover(RemoveImportsVisitor, matcher_setup.QuickSetUp):
  """libcst's pass over the top-level import statements, its unused set given."""

  def __init__(self, context: CodemodContext,
               unused: dict[cst.ImportAlias, cst.Import | cst.ImportFrom]) -> None:
    super().__init__(context)
    self._given = unused

  def visit_Module(self, node: cst.Module) -> None:
    self._unused_imports = dict(self._given)

  def on_visit(self, node: cst.CSTNode) -> bool:
    if isinstance(node, cst.BaseStatement) and not _pure_imports(node):
      super().on_visit(node)
      return False  # the matching imports are all at the top level (see apply)
    return super().on_visit(node)


def apply(context: CodemodContext, new: cst.Module,
          all_scopes: Callable[[], Collection[Scope]], get_metadata: Callable,
          edited_lines: Collection[int], new_code: Callable[[], str],
          written: Collection[str] | None) -> cst.Module:
  """``new`` with the scheduled removals applied, and the schedule cleared, where each is
  decided (see the module's doc); else ``new`` as it is, the schedule left for libcst.
  ``written``: the names the rewrite's own code reads (None: not known)."""
  entries: list[Entry] = context.scratch.get(RemoveImportsVisitor.CONTEXT_KEY, [])
  if not entries or any(_bound_name(entry) is None for entry in entries):
    return new  # a dotted module: libcst's pass
  package = context.full_package_name
  scopes = all_scopes()

  def untouched(node: cst.CSTNode) -> bool:
    pos = get_metadata(PositionProvider, node, None)
    return pos is not None and not any(
        line in edited_lines for line in range(pos.start.line, pos.end.line + 1))

  unused_names: set[str] = set()
  for entry in entries:
    name = _bound_name(entry)
    assert name is not None
    if name in unused_names or _still_used(scopes, entry, name, package, untouched):
      continue
    if written is not None and _reached_by_written(scopes, name, written):
      continue
    unused_names.add(name)
  if not unused_names:
    context.scratch.pop(RemoveImportsVisitor.CONTEXT_KEY)
    return new
  statements = [s for s in new.body if _pure_imports(s)]
  everywhere = _names_in(new_code(), unused_names)
  in_imports = _names_in("".join(new.code_for_node(s) for s in statements), unused_names)
  if everywhere is None or in_imports is None or everywhere != in_imports:
    return new  # the new code may still use one: libcst's pass decides
  unused: dict[cst.ImportAlias, cst.Import | cst.ImportFrom] = {}
  for stmt in statements:
    assert isinstance(stmt, cst.SimpleStatementLine)
    for small in stmt.body:
      if isinstance(small, cst.Import):
        unused.update((a, small) for a in small.names
                      if (a.evaluated_alias or a.evaluated_name) in unused_names)
      elif (isinstance(small, cst.ImportFrom) and small.module is not None
            and not isinstance(small.names, cst.ImportStar)
            and new.code_for_node(small.module) != "__future__"):
        unused.update((a, small) for a in small.names
                      if (a.evaluated_alias or a.evaluated_name) in unused_names)
  result = new.visit(_Remover(context, unused))
  context.scratch.pop(RemoveImportsVisitor.CONTEXT_KEY)
  return result
