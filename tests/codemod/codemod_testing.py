"""Shared pieces for the codemod tests: rewriting source, loading it as a module, and the
``jax.shard_map`` keyword adapter that stands in for jax>=0.6.1's API on jax 0.6.0."""
from __future__ import annotations

import builtins
import sys
import textwrap
import types

import jax
import libcst as cst
from jax.experimental.shard_map import shard_map as experimental_shard_map

from codemod.runner import Options, transform_module


def rewrite(source: str, **options) -> tuple[str, list]:
  """The codemod's output for ``source`` and its findings."""
  module = cst.parse_module(textwrap.dedent(source))
  new, command = transform_module(module, Options(**options))
  return new.code, command.findings


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

from codemod import runtime  # noqa: E402
from codemod.convert_pmap import ConvertPmapCommand  # noqa: E402

HELPERS = "# <pmap-to-shmap helpers>\n"
IMPORTS = ("import functools\nfrom jax.sharding import PartitionSpec as P\n"
           "from jax.experimental.shard_map import shard_map\n")


class PmapCodemodTest(CodemodTest):
  """CodemodTest for ConvertPmapCommand; ``HELPERS`` in an expected output stands for the
  helper block the codemod adds (its text is tested on its own and by execution)."""

  TRANSFORM = ConvertPmapCommand

  def assertConverts(self, before: str, after: str, *, target: str = "experimental",
                     multihost: bool = False, runtime_specs: bool = False) -> None:
    helpers = runtime.helper_source(target, multihost, runtime_specs=runtime_specs)
    after = textwrap.dedent(after).replace(HELPERS, helpers)
    self.assertCodemod(before, after, target=target, multihost=multihost)

  def assertUnchanged(self, before: str, **options) -> None:
    self.assertCodemod(before, before, **options)


TOP = ("import jax\nimport functools\nfrom jax.sharding import PartitionSpec as P\n"
       "from jax.experimental.shard_map import shard_map\n")


class SiteTest(PmapCodemodTest):
  """Before/after for one module-level statement after ``import jax``."""

  def assertSite(self, before_stmt: str, after_stmt: str, **options) -> None:
    before = "import jax\n\n" + textwrap.dedent(before_stmt).strip("\n") + "\n"
    after = TOP + "\n\n" + HELPERS + "\n\n" + textwrap.dedent(after_stmt).strip("\n") + "\n"
    self.assertConverts(before, after, **options)

  def assertSiteError(self, before_stmt: str, reason: str, **options) -> None:
    """The site is left exactly as it is, and reported as an ERROR naming ``reason``."""
    before = "import jax\n\n" + textwrap.dedent(before_stmt).strip("\n") + "\n"
    self.assertUnchanged(before, **options)
    _, findings = rewrite(before, **options)
    errors = [f.message for f in findings if f.severity.value == "ERROR"]
    self.assertTrue(any(reason in m for m in errors), f"no ERROR mentioning {reason!r}: {errors}")
