"""The converted sites' new code, laid out where the old code was, every comment kept.

A site's replacement is planned as ``edits.Call`` values (``edits.render`` lays them out to
the file's limit and indentation); this module puts a call site's replacement where its
expression was and a decorator site's decorators in place of its run of decorators. The
comments of the replaced code go onto the arguments that replace what they described
(``site_comments``), else before the site: none is lost, which is checked against the
replaced nodes. The command applies the plans in its one walk (``replacement``,
``arguments_moved``, ``apply_decorators``).
"""
from __future__ import annotations

import collections
import re
from collections.abc import Callable, Sequence
from typing import cast

import libcst as cst
from libcst.metadata import CodeRange

from codemod import edits, site_comments
from codemod.edits import Arg, Call, Copied
from codemod.sites import Site
from codemod.source_text import SourceText

# A checker's comment that must stay on a statement's first line.
PRAGMA = re.compile(r"#\s*(?:type:\s*ignore|pytype:\s*disable|pyright:\s*ignore|pylint:\s*disable)")


class SiteLayout:
  """The replacements of one file's converted sites, keyed by the nodes they replace."""

  def __init__(self, text: SourceText, position: Callable[[cst.CSTNode], CodeRange],
               is_partial: Callable[[cst.BaseExpression], bool]) -> None:
    self._text = text
    self._position = position
    self._is_partial = is_partial  # whether an expression names functools.partial
    self.calls: dict[cst.CSTNode, cst.BaseExpression] = {}
    self.decorators: dict[cst.FunctionDef, list[tuple[tuple, list[cst.Decorator]]]] = {}
    self._arguments_below: set[cst.CSTNode] = set()  # sites whose call's arguments go below
    self._applied = 0

  def copied(self, node: cst.BaseExpression, keyword: str = "") -> Copied:
    """``node`` (with its parentheses) as written in the file, ``keyword`` before it."""
    return self._text.copied(node, self._position, keyword)

  def code(self) -> list[str]:
    """Text of the new code, a piece per site."""
    return [_code(e) for e in self.calls.values()] + [
        _code(d.decorator) for runs in self.decorators.values() for _, new in runs for d in new]

  @property
  def all_applied(self) -> bool:
    return self._applied == len(self.calls) + sum(map(len, self.decorators.values()))

  def call_site(self, site: Site, roles: dict[str, Arg], fun_arg: Arg, call: Call,
                moved: Sequence[Arg] = ()) -> None:
    """Plans ``call`` in place of the call site, the site's comments kept (on the
    arguments they described, or on ``moved`` arguments, which go elsewhere; those with
    no place before the function)."""
    pos = self._position(site.node).start
    indent = len(self._text.indent_of(pos.line))
    fun_arg.leading.extend(self.attach_comments(site, roles, fun_arg, call))
    # What follows the site on its last line (``(x)`` of ``pmap(f)(x)``) stays there,
    # unless the call's arguments would then pass the limit: they go on a line below.
    end = self._position(site.node).end
    rest = self._text.line(end.line)[end.column:].rstrip()
    pragma = PRAGMA.search(rest)
    if pragma is not None:  # goes to the statement's first line (_pragma_first)
      rest = rest[:pragma.start()].rstrip()
    after = len(rest)
    text = edits.render(call, pos.column, indent, self._text.style, after)
    last = text.rsplit("\n", 1)[-1]
    if rest.startswith("(") and after > 2 and (
        (0 if "\n" in text else pos.column) + len(last) + after > self._text.style.width):
      after = 1  # the "(" stays
      text = edits.render(call, pos.column, indent, self._text.style, after)
      self._arguments_below.add(site.node)
    expression = edits.parse_expression(text)
    missing = _missing_comments(self._site_nodes(site), [expression], comments_of(moved))
    if missing:  # a comment in a place no rule covers: before the function, not lost
      fun_arg.leading.extend(missing)
      expression = edits.parse_expression(
          edits.render(call, pos.column, indent, self._text.style, after))
    self.calls[site.node] = expression

  def decorator_site(self, site: Site, decorators: list[Call | str], fallback: list[str],
                     indent: int, moved: Sequence[Arg] = ()) -> None:
    """Plans ``decorators`` (top to bottom) in place of the site's run of decorators, with
    the comments of the run kept (``fallback``: those with no place of their own; those of
    ``moved`` arguments go elsewhere)."""
    assert site.fundef is not None
    originals = self._site_nodes(site)
    first = site.fundef.decorators[site.decorators[0]]
    new = [cst.Decorator(edits.parse_expression(
               d if isinstance(d, str) else edits.render(d, indent + 1, indent, self._text.style)))
           for d in decorators]
    ordered: list[cst.Comment] = []
    for i in site.decorators:
      dec = site.fundef.decorators[i]
      if dec is not first:
        ordered += [line.comment for line in dec.leading_lines if line.comment is not None]
      if dec.trailing_whitespace.comment is not None:
        ordered.append(dec.trailing_whitespace.comment)
    ends_line = next((c for i in site.decorators
                      if (c := site.fundef.decorators[i].trailing_whitespace.comment)), None)
    if ends_line is not None:
      new[0] = new[0].with_changes(trailing_whitespace=cst.TrailingWhitespace(
          whitespace=cst.SimpleWhitespace("  "), comment=ends_line))
    fallback += [c.value for c in ordered if c is not ends_line]
    kept = [line.comment.value for line in first.leading_lines if line.comment is not None]
    fallback += _missing_comments(originals, new, kept + fallback + comments_of(moved))
    leading = list(first.leading_lines) + [
        cst.EmptyLine(indent=True, comment=cst.Comment(c)) for c in fallback]
    new[0] = new[0].with_changes(leading_lines=leading)
    self.decorators.setdefault(site.fundef, []).append((site.decorators, new))

  def _site_nodes(self, site: Site) -> list[cst.CSTNode]:
    """The nodes the conversion replaces (their comments must all reappear)."""
    if site.fundef is None:
      return [site.node]
    return [site.fundef.decorators[i] for i in site.decorators]

  def _source_calls(self, level: Site) -> list[tuple[cst.Call, bool]]:
    """The calls written at one pmap level, each with whether it is ``partial(pmap, ...)``
    (whose first argument is pmap itself)."""
    node = level.node.decorator if isinstance(level.node, cst.Decorator) else level.node
    if not isinstance(node, cst.Call):
      return []
    if isinstance(level.node, cst.Decorator):
      return [(node, True)]
    if isinstance(node.func, cst.Call) and self._is_partial(node.func.func):
      return [(node, False), (node.func, True)]
    return [(node, False)]

  def attach_comments(self, site: Site, roles: dict[str, Arg], fun_arg: Arg | None,
                      outer: Call | None) -> list[str]:
    """Moves the comments of the site's calls onto the arguments that replace what they
    described; returns those with no place (for the caller to put before the site)."""
    homeless: list[str] = []
    placed: list[tuple[str | None, site_comments.ArgComments]] = []
    levels = site.levels()
    for level in levels:
      values = level.options.values
      copied = {id(v) for name, v in values.items()
                if name in ("fun", "static_broadcasted_argnums", "donate_argnums", "devices",
                            "backend", "axis_size")}
      copied |= {id(lv.node) for lv in levels}
      if level.fun is not None:
        copied.add(id(level.fun))
      for call, is_partial in self._source_calls(level):
        found = site_comments.of_call(call, copied)
        if outer is not None:
          outer.head.extend(found.head)
          outer.tail.extend(found.tail)
          outer.close_alone |= found.close_alone and level is levels[0]
        else:
          homeless.extend(found.head + found.tail)
        for i, (arg, comments) in enumerate(zip(call.args, found.args, strict=True)):
          role = next((name for name, v in values.items() if v is arg.value), None)
          if is_partial and i == 0:
            role = "pmap"
          placed.append((role, comments))
    # axis_name shares in_specs with in_axes: in_axes's own comment keeps the line's end.
    placed.sort(key=lambda item: item[0] == "axis_name")
    for role, comments in placed:
      target = roles.get(role or "", fun_arg)
      if target is None:
        homeless.extend(comments.leading + comments.trailing)
        continue
      target.leading.extend(comments.leading)
      target.trailing.extend(comments.trailing)
    return homeless

  # ----- applying the plans -----

  def arguments_moved(self, original: cst.Call, updated: cst.Call) -> cst.Call:
    """The call a converted call site is called by (``pmap(f)(x)``), its arguments on a
    line below where the site's new code leaves no room for them."""
    if original.func in self._arguments_below and updated.args:
      return updated.with_changes(whitespace_before_args=cst.ParenthesizedWhitespace(
          indent=True, last_line=cst.SimpleWhitespace(self._text.style.hang)))
    return updated

  def replacement(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression | None:
    """The new expression for a converted call site; None for any other call."""
    new = self.calls.get(original)
    if new is None:
      return None
    self._applied += 1
    return new.with_changes(lpar=updated.lpar, rpar=updated.rpar)

  def apply_decorators(self, original: cst.FunctionDef,
                       updated: cst.FunctionDef) -> cst.FunctionDef:
    runs = self.decorators.get(original)
    if not runs:
      return updated
    replace = {indices[0]: (set(indices), new) for indices, new in runs}
    out: list[cst.Decorator] = []
    skip: set = set()
    for i, dec in enumerate(updated.decorators):
      if i in replace:
        skip, new = replace[i]
        out.extend(new)
        self._applied += 1
      elif i not in skip:
        out.append(dec)
    return updated.with_changes(decorators=out)


def pragma_first(statement: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
  """``statement`` with a checker's comment (``# type: ignore``) that ended its one line
  moved to the end of its first line, now that it spans several: mypy, pytype and pylint
  read it there."""
  comment = statement.trailing_whitespace.comment
  if comment is None or not PRAGMA.match(comment.value) or "\n" not in _code(
      statement.with_changes(leading_lines=[])).rstrip("\n"):
    return statement
  moved = statement.visit(_FirstLineComment(comment))
  if moved is statement:
    return statement
  return cast(cst.SimpleStatementLine, moved).with_changes(
      trailing_whitespace=statement.trailing_whitespace.with_changes(
          whitespace=cst.SimpleWhitespace(""), comment=None))


class _FirstLineComment(cst.CSTTransformer):
  """Puts ``comment`` at the end of the first line break of the node, where none is."""

  def __init__(self, comment: cst.Comment):
    self.comment = comment
    self.first: cst.ParenthesizedWhitespace | None = None

  def visit_ParenthesizedWhitespace(self, node: cst.ParenthesizedWhitespace) -> bool:
    if self.first is None:
      self.first = node
    return False

  def leave_ParenthesizedWhitespace(self, original_node: cst.ParenthesizedWhitespace,
                                    updated_node: cst.ParenthesizedWhitespace
                                    ) -> cst.ParenthesizedWhitespace:
    if original_node is not self.first or updated_node.first_line.comment is not None:
      return updated_node
    return updated_node.with_changes(first_line=updated_node.first_line.with_changes(
        whitespace=cst.SimpleWhitespace("  "), comment=self.comment))




def comments_of(args: Sequence[Arg]) -> list[str]:
  return [c for arg in args for c in arg.leading + arg.trailing]


def _missing_comments(originals: Sequence[cst.CSTNode], new: Sequence[cst.CSTNode],
                      placed: Sequence[str] = ()) -> list[str]:
  """The comments of ``originals`` that neither ``new`` nor ``placed`` holds (as many times)."""
  have = collections.Counter(c.value for node in new for c in site_comments.comments_in(node))
  have.update(placed)
  missing = []
  for node in originals:
    for comment in site_comments.comments_in(node):
      if have[comment.value]:
        have[comment.value] -= 1
      else:
        missing.append(comment.value)
  return missing


def _code(node: cst.CSTNode) -> str:
  return cst.Module([]).code_for_node(node)
