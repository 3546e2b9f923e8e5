"""The comments a user wrote inside a pmap site's calls, by the argument they describe.

libcst keeps a comment in the whitespace around tokens: a comment after an argument's
comma (on that argument's line) is the argument's *trailing* comment; comment lines
before an argument are its *leading* ones; a comment right after ``(`` is the call's
*head*, comment lines before ``)`` its *tail*. Comments inside an argument's value belong
to that argument too, unless the value is copied into the new code as it is (then they
travel inside it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from codemod import together


@dataclass
class ArgComments:
  leading: list[str] = field(default_factory=list)
  trailing: list[str] = field(default_factory=list)


@dataclass
class CallComments:
  head: list[str] = field(default_factory=list)
  tail: list[str] = field(default_factory=list)
  args: list[ArgComments] = field(default_factory=list)  # one per argument of the call
  close_alone: bool = False  # ")" on a line of its own after the last argument


def comments_in(node: cst.CSTNode | None) -> list[cst.Comment]:
  """Every comment under ``node``, in source order."""
  if node is None:
    return []
  collect = _Collect()
  together.walk(node, [collect])
  return collect.found


class _Collect(cst.CSTVisitor):
  def __init__(self) -> None:
    super().__init__()
    self.found: list[cst.Comment] = []

  def visit_Comment(self, comment: cst.Comment) -> None:
    self.found.append(comment)


def of_call(call: cst.Call, kept: set[int]) -> CallComments:
  """``call``'s comments by argument. ``kept`` holds the ids of argument values copied into
  the new code as they are; their inner comments are not listed."""
  out = CallComments(args=[ArgComments() for _ in call.args])
  first_line, lines = _split(call.whitespace_before_args)
  out.head.extend(first_line)
  (out.args[0].leading if call.args else out.tail).extend(lines)
  for i, arg in enumerate(call.args):
    after: list[cst.CSTNode] = [arg.whitespace_after_arg]
    if isinstance(arg.comma, cst.Comma):
      after = [arg.comma.whitespace_before, arg.whitespace_after_arg, arg.comma.whitespace_after]
    skip = {id(c) for part in after for c in comments_in(part)}
    if id(arg.value) in kept:
      skip |= {id(c) for c in comments_in(arg.value)}
    out.args[i].leading.extend(c.value for c in comments_in(arg) if id(c) not in skip)
    if i == len(call.args) - 1:
      out.close_alone = any(isinstance(part, cst.ParenthesizedWhitespace) for part in after)
    for part in after:
      first_line, lines = _split(part)
      out.args[i].trailing.extend(first_line)
      (out.args[i + 1].leading if i + 1 < len(call.args) else out.tail).extend(lines)
  return out


def _split(whitespace: cst.CSTNode) -> tuple[list[str], list[str]]:
  """(the comment ending the current line, the comment lines after it)."""
  if not isinstance(whitespace, cst.ParenthesizedWhitespace):
    return [], []
  first = whitespace.first_line.comment
  lines = [line.comment.value for line in whitespace.empty_lines if line.comment is not None]
  return ([first.value] if first is not None else []), lines
