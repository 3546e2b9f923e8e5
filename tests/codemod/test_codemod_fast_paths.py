"""Rule: the codemod's shortcuts give exactly what the slow ways give: ``together.walk``
makes the calls ``node.visit`` makes, and the import removals decided without libcst's
second metadata pass are libcst's own (same output, byte for byte)."""
from __future__ import annotations

import textwrap
import unittest
from unittest import mock

import libcst as cst
from libcst.codemod.visitors import RemoveImportsVisitor

from codemod import together, unused_imports
from codemod_testing import rewrite

_SYNTAX = '''
"""Doc."""
from __future__ import annotations
import os, sys as system
from . import sibling
from .pkg.mod import (a, b as c,  # trailing
                      d)
from x import *

@decorator(arg=1)
@other
async def f(p, /, q: int = 1, *args, r, s=2, **kwargs) -> "T":
  global g
  async with ctx() as (m, n), other:
    async for i in aiter():
      await i
  x = [y for y in range(3) if y if not y]
  z = {k: v for k, v in items()}
  w = {e async for e in gen()}
  v = (t for t in ())
  lam = lambda a, *b, c=3, **d: (a, b, c, d)
  s = f"{x!r:>{width}} {y=} {{}}" "plain" r"raw"
  if (n := len(x)) > 1 and not n or n is None:
    pass
  elif x[1:2, ::3, ...]:
    raise ValueError("bad") from None
  else:
    del x[0], y.attr
  try:
    yield from gen()
  except* (TypeError, ValueError) as err:
    pass
  finally:
    return
  match command:
    case [Point(x=0, y=0), *rest] if rest:
      pass
    case {"k": 1, **others} | (1 | 2 as num):
      pass
    case _:
      pass


class C(Base, metaclass=Meta):
  a: int = 1
  b += 2; c @= d; e **= 3

  def m(self):
    nonlocal_value = -~+1 if self else 2j + 1.5e3 // 4 % 5 << 6 >> 7 & 8 | 9 ^ 10
    assert nonlocal_value, "msg"
    while True:
      break
    else:
      continue
    with open("f") as fh, \\
        open("g"):
      print(*fh, **{"end": ""}, sep="")
'''


class _Recorder(cst.CSTVisitor):
  """Records the typed hooks libcst calls; declines Lambda and Attribute subtrees."""

  def __init__(self) -> None:
    super().__init__()
    self.events: list[tuple[str, int]] = []

  def visit_Name(self, node: cst.Name) -> None:
    self.events.append(("Name", id(node)))

  def visit_Lambda(self, node: cst.Lambda) -> bool:
    self.events.append(("Lambda", id(node)))
    return False

  def visit_Attribute(self, node: cst.Attribute) -> bool:
    self.events.append(("Attribute", id(node)))
    return False

  def leave_Attribute(self, original_node: cst.Attribute) -> None:
    self.events.append(("/Attribute", id(original_node)))

  def leave_Call(self, original_node: cst.Call) -> None:
    self.events.append(("/Call", id(original_node)))

  def visit_Comment(self, node: cst.Comment) -> None:
    self.events.append(("Comment", id(node)))


class _Everything(cst.CSTVisitor):
  """Records every node entered and left (its own on_visit / on_leave)."""

  def __init__(self) -> None:
    super().__init__()
    self.events: list[tuple[str, int]] = []

  def on_visit(self, node: cst.CSTNode) -> bool:
    self.events.append(("enter", id(node)))
    return not isinstance(node, cst.Subscript)

  def on_leave(self, original_node: cst.CSTNode) -> None:
    self.events.append(("leave", id(original_node)))


class WalkTest(unittest.TestCase):

  def test_walk_makes_the_calls_visit_makes(self):
    module = cst.parse_module(textwrap.dedent(_SYNTAX))
    expected = [_Recorder(), _Everything()]
    for visitor in expected:
      module.visit(visitor)
    walked = [_Recorder(), _Everything()]
    together.walk(module, walked)
    for want, got in zip(expected, walked, strict=True):
      self.assertTrue(want.events)
      self.assertEqual(want.events, got.events)

  def test_per_attribute_hooks_are_refused(self):
    class Hooked(cst.CSTVisitor):
      def visit_Call_func(self, node: cst.Call) -> None:
        pass

    with self.assertRaises(AssertionError):
      together.walk(cst.parse_module("f(x)\n"), [Hooked()])


# Sources whose conversion schedules import removals: each decided without libcst's pass
# (True) or left to it (False).
_REMOVALS = {
    "all_converted": (True, """
        from jax import pmap

        f = pmap(lambda x: x * 2)
        """),
    "one_left_as_a_value": (True, """
        from jax import pmap, jit

        f = pmap(lambda x: x * 2)
        g = [pmap]
        """),
    "among_others_with_comments": (True, """
        from jax import (jit,  # jit
                         pmap,  # the one to go
                         vmap)

        f = pmap(lambda x: x * 2)
        h = jit(vmap(lambda x: x))
        """),
    "aliased": (True, """
        from jax import pmap as pm

        f = pm(lambda x: x * 2, axis_name="i")
        """),
    "spelled_in_a_comment_and_a_docstring": (True, """
        \'\'\'Runs pmap.\'\'\'
        from jax import pmap

        # pmap once ran here
        f = pmap(lambda x: x * 2)

        def g():
          "Not pmap any more." "Really."
        """),
    "spelled_in_a_string": (False, """
        from jax import pmap

        f = pmap(lambda x: x * 2)
        print("pmap")
        """),
    "in_an_f_string": (True, """
        from jax import pmap

        f = pmap(lambda x: x * 2)
        print(f"{pmap}")
        """),
    "string_annotation": (False, """
        from jax import pmap

        f: "pmap" = pmap(lambda x: x * 2)
        """),
    "attribute_of_that_name": (True, """
        import jax
        from jax import pmap

        f = pmap(lambda x: x * 2)
        g = jax.pmap
        """),
    "exported": (False, """
        from jax import pmap

        __all__ = ["pmap"]
        f = pmap(lambda x: x * 2)
        """),
    "imported_in_a_function": (False, """
        def make():
          from jax import pmap
          return pmap(lambda x: x * 2)
        """),
    "used_in_a_function": (True, """
        from jax import pmap

        def make(g):
          return pmap(g)

        f = pmap(lambda x: x * 2)
        """),
    # A site whose options are known at run time keeps pmap's call under another name,
    # and schedules `import jax` for removal.
    "module_still_used": (True, """
        import jax

        def make(axes):
          return jax.pmap(lambda x: x * 2, in_axes=axes)

        g = jax.jit(lambda x: x)
        """),
    "module_unused_after": (True, """
        import jax
        import jax.numpy as jnp

        def make(axes):
          return jax.pmap(lambda x: jnp.sin(x), in_axes=axes)
        """),
    "module_aliased": (True, """
        import jax as j

        def make(axes):
          return j.pmap(lambda x: x * 2, in_axes=axes)
        """),
    "module_through_a_submodule": (False, """
        import jax
        import jax.numpy

        def make(axes):
          return jax.pmap(lambda x: jax.numpy.sin(x), in_axes=axes)
        """),
    "module_imported_in_a_function": (False, """
        def make(axes):
          import jax
          return jax.pmap(lambda x: x * 2, in_axes=axes)
        """),
    "flax_unreplicate": (True, """
        import jax
        from flax import jax_utils

        step = jax.pmap(lambda x: x * 2)
        state = jax_utils.replicate(1.0)
        out = jax_utils.unreplicate(step(state))
        """),
}


class NamesReadTest(unittest.TestCase):
  """The names the rewrite's own code reads decide that an import stays: a name token
  that is an attribute or a keyword argument is not one, and text that does not tokenize
  decides nothing."""

  def test_names_read(self):
    self.assertEqual(unused_imports.names_read("jax.jit(f, out=P('i'))\nfirst_rows("),
                     {"jax", "f", "P", "first_rows"})
    self.assertEqual(unused_imports.names_read("g(x == y)"), {"g", "x", "y"})

  def test_untokenizable(self):
    self.assertIsNone(unused_imports.names_read('f("jax'))
    self.assertIsNone(unused_imports.names_read('f("""jax'))


class ImportRemovalTest(unittest.TestCase):

  def _compare(self, name: str, **options) -> None:
    decided, source = _REMOVALS[name]
    with mock.patch.object(unused_imports, "apply", lambda context, new, *rest: new):
      slow, slow_findings = rewrite(source, **options)
    passes = []
    original = RemoveImportsVisitor.transform_module

    def counted(visitor, tree):
      passes.append(type(visitor))
      return original(visitor, tree)

    with mock.patch.object(RemoveImportsVisitor, "transform_module", counted):
      fast, fast_findings = rewrite(source, **options)
    self.assertEqual(slow, fast)
    self.assertEqual(slow_findings, fast_findings)
    self.assertEqual(not passes, decided, f"libcst's pass ran: {passes}")

  def test_each_removal_is_libcsts(self):
    for name in _REMOVALS:
      for target in ("experimental", "jax"):
        with self.subTest(name, target=target):
          self._compare(name, target=target)

  def test_removed_name_imports(self):
    # --target jax schedules `from jax import tree_map` (its calls become jax.tree.map).
    cases = {
        "tree_map_renamed": (True, """
            import jax
            from jax import tree_map

            f = jax.pmap(lambda x: x)
            y = tree_map(lambda v: v, {})
            """),
        "tree_map_copied_into_a_site": (True, """
            import jax
            from jax import tree_map

            f = jax.pmap(lambda x: tree_map(lambda y: y, x))
            """)}
    with mock.patch.dict(_REMOVALS, cases):
      for name in cases:
        with self.subTest(name):
          self._compare(name, target="jax")


if __name__ == "__main__":
  unittest.main()
