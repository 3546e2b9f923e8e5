"""Source-level edits the rewrite makes around the sites themselves.

Formatting the generated calls (one line when it fits, else hanging indents that keep
their full indentation wherever they are inserted), adding the helper block before the
first converted statement (only the helpers a file lacks, so reruns change nothing), and
running ``AddImportsVisitor`` over a file's leading imports only.
"""
from __future__ import annotations

import functools
from typing import Sequence

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor

from codemod import runtime

HANG = "    "
WIDTH = 88
_ANCHOR_TEXT = "# pmap-to-shmap: helpers go here"
_ANCHOR = cst.EmptyLine(comment=cst.Comment(_ANCHOR_TEXT))


def format_call(name: str, args: list[str], indent: str, column: int) -> str:
  """``name(args)`` on one line when it fits, else one hanging-indented run of lines."""
  flat = f"{name}({', '.join(args)})"
  if column + len(flat) <= WIDTH and "\n" not in flat:
    return flat
  lines, current = [], ""
  for arg in args:
    piece = arg if not current else f"{current}, {arg}"
    if current and (len(indent) + len(piece) + 1 > WIDTH or "\n" in arg):
      lines.append(current + ",")
      current = arg
    else:
      current = piece
  lines.append(current + ")")
  return f"{name}(\n" + "\n".join(indent + line for line in lines)


class _AbsoluteIndent(cst.CSTTransformer):
  """Continuation lines carry their full indentation, not the enclosing block's on top."""

  def leave_ParenthesizedWhitespace(self, original_node, updated_node):
    return updated_node.with_changes(indent=False)


def parse_expression(text: str) -> cst.BaseExpression:
  return cst.parse_expression(text).visit(_AbsoluteIndent())


def mark_anchor(stmt: cst.BaseStatement) -> cst.BaseStatement:
  """Marks the statement the helpers go before (the import passes may rebuild it)."""
  return stmt.with_changes(leading_lines=list(stmt.leading_lines) + [_ANCHOR])


def _comments(stmt: cst.CSTNode) -> list[str]:
  return [line.comment.value for line in getattr(stmt, "leading_lines", ()) if line.comment]


def _defines(stmt: cst.CSTNode) -> list[str]:
  """The module-level names a helper statement binds (a def, or ``name = ...``)."""
  if isinstance(stmt, cst.FunctionDef):
    return [stmt.name.value]
  if isinstance(stmt, cst.SimpleStatementLine):
    return [t.target.value for small in stmt.body if isinstance(small, cst.Assign)
            for t in small.targets if isinstance(t.target, cst.Name)]
  return []


def _strip_blank(lines: Sequence[cst.EmptyLine]) -> list[cst.EmptyLine]:
  lines = list(lines)
  while lines and lines[0].comment is None:
    lines.pop(0)
  return lines


@functools.lru_cache(maxsize=None)
def _helper_module(target: str, multihost: bool, indent: str, newline: str,
                   runtime_specs: bool) -> cst.Module:
  """The parsed helper block (CST nodes are immutable, so one parse serves every file)."""
  text = runtime.helper_source(target, multihost, indent, runtime_specs)
  # Multi-line strings (the docstrings) carry their newlines in the literal itself.
  return cst.parse_module(text.replace("\n", newline))


def insert_helpers(tree: cst.Module, target: str, multihost: bool,
                   runtime_specs: bool) -> cst.Module:
  """Adds the helper functions ``tree`` lacks before the anchored statement."""
  body = list(tree.body)
  at = next((i for i, stmt in enumerate(body) if _ANCHOR_TEXT in _comments(stmt)), len(body))
  if at < len(body):
    body[at] = body[at].with_changes(leading_lines=[
        line for line in body[at].leading_lines
        if line.comment is None or line.comment.value != _ANCHOR_TEXT])
  parsed = _helper_module(target, multihost, tree.default_indent, tree.default_newline,
                          runtime_specs)
  # A file converted before keeps its helpers; only missing ones are added.
  defined = {name for stmt in body for name in _defines(stmt)}
  helper = [s for s in parsed.body if not set(_defines(s)) & defined]
  if not helper:
    return tree.with_changes(body=body)
  header = list(parsed.header) if len(helper) == len(parsed.body) else []
  helper[0] = helper[0].with_changes(
      leading_lines=[cst.EmptyLine(), cst.EmptyLine()] + header
      + _strip_blank(helper[0].leading_lines))
  if at < len(body):
    body[at] = body[at].with_changes(
        leading_lines=[cst.EmptyLine(), cst.EmptyLine()] + _strip_blank(body[at].leading_lines))
  body[at:at] = helper
  return tree.with_changes(body=body)


def _is_import_line(stmt: cst.CSTNode) -> bool:
  return isinstance(stmt, cst.SimpleStatementLine) and all(
      isinstance(small, (cst.Import, cst.ImportFrom)) for small in stmt.body)


def _leading_imports_end(body: list) -> int:
  """Index of the first statement after the docstring / __strict__ flag and the imports."""
  k = 0
  if body and isinstance(body[0], cst.SimpleStatementLine) and len(body[0].body) == 1:
    first = body[0].body[0]
    if (isinstance(first, cst.Expr) and isinstance(first.value, cst.SimpleString)) or (
        isinstance(first, cst.Assign) and len(first.targets) == 1
        and isinstance(first.targets[0].target, cst.Name)
        and first.targets[0].target.value == "__strict__"):
      k = 1
  while k < len(body) and _is_import_line(body[k]):
    k += 1
  return k


def add_imports_in_head(tree: cst.Module, context: CodemodContext) -> cst.Module:
  """AddImportsVisitor, run over the file's leading imports only.

  It reads and edits nothing past the first statement that is not an import, so the
  rest of the (possibly large) module is set aside instead of walked; a stand-in
  keeps that statement's leading lines, which the visitor may adjust.
  """
  if AddImportsVisitor.CONTEXT_KEY not in context.scratch:
    return tree
  body = list(tree.body)
  k = _leading_imports_end(body)
  head = body[:k]
  if k < len(body):
    head.append(cst.SimpleStatementLine([cst.Pass()], leading_lines=body[k].leading_lines))
  new_head = list(tree.with_changes(body=head).visit(AddImportsVisitor(context)).body)
  if k < len(body):
    stand_in = new_head.pop()
    new_head.append(body[k].with_changes(leading_lines=stand_in.leading_lines))
    new_head.extend(body[k + 1:])
  return tree.with_changes(body=new_head)
