"""Shared pieces for the codemod tests: rewriting source, loading it as a module (with the
support module the converted code imports), and the ``jax.shard_map`` keyword adapter
that stands in for jax>=0.6.1's API on jax 0.6.0."""
from __future__ import annotations

import ast
import builtins
import re
import sys
import textwrap
import types

import jax
import libcst as cst
from jax.experimental.shard_map import shard_map as experimental_shard_map

from codemod import support_module
from codemod.runner import Options, transform_module


def rewrite(source: str, **options) -> tuple[str, list]:
  """The codemod's output for ``source`` and its findings."""
  module = cst.parse_module(textwrap.dedent(source))
  out = transform_module(module, Options(**options))
  return out.module.code, out.findings


def rewrite_with_support(source: str, **options) -> tuple[str, types.ModuleType]:
  """The codemod's output for ``source``, and the support module it writes for it (just
  what its sites call), loaded under the name the output imports."""
  module = cst.parse_module(textwrap.dedent(source))
  out = transform_module(module, Options(**options))
  written = types.ModuleType(support_module.DEFAULT_NAME)
  written.__file__ = f"<{support_module.DEFAULT_NAME} for {sorted(out.support_names)}>"
  exec(compile(support_module.source(out.support_names), written.__file__, "exec"),
       written.__dict__)
  return out.module.code, written


def support() -> types.ModuleType:
  """The support module, as the converted code imports it (one instance per test run)."""
  name = support_module.DEFAULT_NAME
  if name not in sys.modules:
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    exec(compile(support_module.source(), module.__file__, "exec"), module.__dict__)
    sys.modules[name] = module
  return sys.modules[name]


def keyword_shard_map(f, *, mesh, in_specs, out_specs, check_vma=True):
  """jax.shard_map's keyword signature, on top of jax 0.6.0's experimental shard_map."""
  return experimental_shard_map(f, mesh, in_specs, out_specs, check_rep=check_vma)


class _JaxWithShardMap(types.ModuleType):
  """``jax`` as seen by the loaded module: everything real, plus ``jax.shard_map``."""

  shard_map = staticmethod(keyword_shard_map)

  def __getattr__(self, name):
    return getattr(jax, name)


_JAX_VIEW = _JaxWithShardMap("jax")


def _importer(real_import):
  def importer(name, globals=None, locals=None, fromlist=(), level=0):
    module = real_import(name, globals, locals, fromlist, level)
    if module is jax and level == 0:
      return _JAX_VIEW
    return module
  return importer


def load(source: str, name: str, *, with_jax_shard_map: bool = False) -> types.ModuleType:
  """Executes ``source`` as a fresh module (registered while it runs, for dataclasses)."""
  support()
  module = types.ModuleType(name)
  module.__file__ = f"<{name}>"
  if with_jax_shard_map:
    module.__dict__["__builtins__"] = dict(vars(builtins), __import__=_importer(builtins.__import__))
  sys.modules[name] = module
  try:
    exec(compile(source, module.__file__, "exec"), module.__dict__)
  finally:
    del sys.modules[name]
  return module


from libcst.codemod import CodemodTest  # noqa: E402

from codemod.convert_pmap import ConvertPmapCommand  # noqa: E402


def normalized(source: str) -> tuple[list[str], list[str]]:
  """A module's imports (as a sorted multiset) and its other statements, layout aside."""
  tree = ast.parse(textwrap.dedent(source))
  imports = sorted(ast.dump(s) for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom)))
  rest = [ast.dump(s) for s in tree.body if not isinstance(s, (ast.Import, ast.ImportFrom))]
  return imports, rest


SUPPORT_NAMES = ("host_local_io", "on_pmap_mesh", "per_device", "placed_on", "pmap_devices",
                 "pmap_via_shard_map")


def support_import(code: str) -> str:
  """The ``pmap_shard_map`` import of the support names ``code`` uses ("" for none)."""
  used = [n for n in SUPPORT_NAMES if re.search(rf"(?<![\w.]){n}\b", code)]
  return f"from pmap_shard_map import {', '.join(used)}\n" if used else ""


class PmapCodemodTest(CodemodTest):
  """CodemodTest for ConvertPmapCommand.

  ``assertConverts`` compares code, not layout (the layout has tests of its own, which
  use ``assertCodemod`` directly); an expected output without a ``pmap_shard_map``
  import gets the one of the support names it uses (``placed_on``, ``per_device``,
  ``on_pmap_mesh``, ...).
  """

  TRANSFORM = ConvertPmapCommand

  def assertConverts(self, before: str, after: str, *, target: str = "experimental",
                     multihost: bool = False, pmap_sites: bool = True) -> None:
    after = textwrap.dedent(after)
    if pmap_sites and "from pmap_shard_map import" not in after:
      after = support_import(after) + after
    new, _ = rewrite(before, target=target, multihost=multihost)
    self.assertEqual(normalized(after), normalized(new), f"\n--- got ---\n{new}")
    again, _ = rewrite(new, target=target, multihost=multihost)
    self.assertEqual(again, new, "a second run changed the output")

  def assertUnchanged(self, before: str, **options) -> None:
    self.assertCodemod(before, before, **options)


TOP = ("import jax\nfrom jax.sharding import PartitionSpec as P\n"
       "from jax.experimental.shard_map import shard_map\n")


class SiteTest(PmapCodemodTest):
  """Before/after for one module-level statement after ``import jax``."""

  def assertSite(self, before_stmt: str, after_stmt: str, **options) -> None:
    """``after_stmt``: what the statement becomes, with the mesh statement a site of the
    plain form gets before it (``mesh = jax.sharding.Mesh(jax.devices(), ("i",))``)."""
    before = "import jax\n\n" + textwrap.dedent(before_stmt).strip("\n") + "\n"
    after = textwrap.dedent(after_stmt).strip("\n") + "\n"
    imports = TOP + ("import functools\n" if "functools." in after else "")
    after = imports + support_import(after) + "\n" + after
    self.assertConverts(before, after, **options)

  def assertSiteError(self, before_stmt: str, reason: str, **options) -> None:
    """The site is left exactly as it is, and reported as an ERROR naming ``reason``."""
    before = "import jax\n\n" + textwrap.dedent(before_stmt).strip("\n") + "\n"
    self.assertUnchanged(before, **options)
    _, findings = rewrite(before, **options)
    errors = [f.message for f in findings if f.severity.value == "ERROR"]
    self.assertTrue(any(reason in m for m in errors), f"no ERROR mentioning {reason!r}: {errors}")
