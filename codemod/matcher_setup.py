"""libcst's matcher set-up, done once per transformer class.

``MatcherDecoratableTransformer.__init__`` inspects every method of the class for matcher
decorators: milliseconds for each instance, as long as parsing a short file, and the
codemod makes its transformers afresh for each file.
"""
from __future__ import annotations

import copy

from libcst.codemod import Codemod, CodemodContext, ContextAwareTransformer
from libcst.matchers import MatcherDecoratableTransformer

# Per transformer class: what libcst's matcher set-up left on an instance, where it was only
# empty containers and None (the class has no matcher decorators), else None.
_MATCHER_STATE: dict[type, dict[str, object] | None] = {}


def init_matchers(command: MatcherDecoratableTransformer) -> None:
  """``MatcherDecoratableTransformer.__init__``, which inspects every method of the class
  (milliseconds a file: as long as parsing a short one), run once per class; later
  instances get fresh copies of the empty state it set up."""
  cls = type(command)
  if cls in _MATCHER_STATE:
    state = _MATCHER_STATE[cls]
    if state is not None:
      for name, value in state.items():
        setattr(command, name, copy.copy(value))
      return
  before = dict(vars(command))
  MatcherDecoratableTransformer.__init__(command)
  added = {k: v for k, v in vars(command).items() if k not in before or before[k] is not v}
  empty = all(v is None or (isinstance(v, (dict, list, set)) and not v) for v in added.values())
  _MATCHER_STATE[cls] = added if empty else None


class QuickSetUp(ContextAwareTransformer):
  """``ContextAwareTransformer`` with the matcher set-up done once per class; as a base
  after a libcst transformer (``class T(RemoveImportsVisitor, QuickSetUp)``) it takes
  the place of that transformer's ``ContextAwareTransformer.__init__``."""

  def __init__(self, context: CodemodContext) -> None:
    Codemod.__init__(self, context)
    init_matchers(self)
