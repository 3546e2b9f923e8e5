"""Code that replaces ``jax.pmap`` while it runs (a test's fake pmap), found by reading it.

Under ``mock.patch("jax.pmap", fake)`` or chex's ``fake_pmap()``, a ``jax.pmap`` the code
reaches is the fake (chex's runs ``vmap``), not JAX's pmap: rewriting it to shard_map
changes what that code runs. A file that patches jax.pmap, or calls a function that does,
keeps its pmap sites; the report says why, and that code converted elsewhere no longer
calls jax.pmap, so the patch no longer reaches it.

A *patcher* is a function whose body patches jax.pmap, or calls a patcher: found across
the files of one run (``patchers``), and chex's public ``fake_pmap`` /
``fake_pmap_and_jit`` for repositories that use chex without holding its source.

A module that binds ``pmap`` itself (``from jax import pmap``) calls its own global, which
code elsewhere may replace (neural-tangents' tests: ``batching.pmap = stub``, through a
helper that takes the module as a parameter). ``module_replacements`` finds those in a
run's files, and ``replacing`` says which of them may reach a given file.
"""
from __future__ import annotations

import ast
import os
from collections.abc import Iterable
from dataclasses import dataclass

# chex's functions that patch jax.pmap (chex/_src/fake.py), by the name code calls.
KNOWN_PATCHERS = frozenset({"fake_pmap", "fake_pmap_and_jit"})
# Text a patch of jax.pmap must contain: files without it are not parsed.
_MARKERS = ("jax.pmap", "'pmap'", '"pmap"')


@dataclass(frozen=True)
class Patch:
  """Where a file patches jax.pmap, and how (``mock.patch("jax.pmap")``, ``fake_pmap``)."""
  line: int
  column: int
  how: str


def _called_name(func: ast.expr) -> str | None:
  if isinstance(func, ast.Name):
    return func.id
  if isinstance(func, ast.Attribute):
    return func.attr
  return None


def _string(node: ast.expr) -> str | None:
  return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _patches_directly(node: ast.AST) -> str | None:
  """How ``node`` replaces jax.pmap itself, or None: ``mock.patch("jax.pmap", ...)``,
  ``mock.patch.object(jax, "pmap", ...)``, ``setattr(jax, "pmap", ...)``,
  ``monkeypatch.setattr("jax.pmap", ...)``, ``jax.pmap = ...``."""
  if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    for target in targets:
      if (isinstance(target, ast.Attribute) and target.attr == "pmap"
          and isinstance(target.value, ast.Name) and target.value.id == "jax"):
        return "jax.pmap = ..."
    return None
  if not isinstance(node, ast.Call):
    return None
  name = _called_name(node.func)
  strings = [_string(arg) for arg in node.args[:2]]
  if name in ("patch", "setattr") and strings[:1] == ["jax.pmap"]:
    return f'{name}("jax.pmap", ...)'
  if name in ("object", "setattr") and len(strings) == 2 and strings[1] == "pmap":
    return f'{"patch.object" if name == "object" else name}(..., "pmap", ...)'
  return None


def _may_patch(text: str) -> bool:
  return any(marker in text for marker in _MARKERS)


def patchers(texts: Iterable[str]) -> frozenset[str]:
  """The names of the functions in ``texts`` (a run's Python sources) that patch jax.pmap
  while they run, directly or by calling one another, and chex's."""
  calls: dict[str, set[str]] = {}  # function name -> the names its body calls
  found = set(KNOWN_PATCHERS)
  for text in texts:
    if not _may_patch(text):
      continue
    try:
      tree = ast.parse(text)
    except (SyntaxError, ValueError):
      continue
    for fun in ast.walk(tree):
      if not isinstance(fun, (ast.FunctionDef, ast.AsyncFunctionDef)):
        continue
      for node in ast.walk(fun):
        if _patches_directly(node):
          found.add(fun.name)
        elif isinstance(node, ast.Call) and (callee := _called_name(node.func)):
          calls.setdefault(fun.name, set()).add(callee)
  grown = True
  while grown:
    grown = False
    for name, called in calls.items():
      if name not in found and called & found:
        found.add(name)
        grown = True
  return frozenset(found)


def _patch_at(node: ast.AST, known: frozenset[str]) -> Patch | None:
  if not isinstance(node, (ast.stmt, ast.expr)):
    return None
  how = _patches_directly(node)
  if how is None and isinstance(node, ast.Call) and _called_name(node.func) in known:
    how = f"{_called_name(node.func)}(...)"
  return None if how is None else Patch(node.lineno, node.col_offset + 1, how)


def _span(node: ast.stmt) -> tuple[int, int]:
  """The lines of a top-level statement, its decorators included."""
  decorators = getattr(node, "decorator_list", [])
  return min([node.lineno, *(d.lineno for d in decorators)]), node.end_lineno or node.lineno


def _module_wide(node: ast.stmt) -> bool:
  """Whether a patch in top-level statement ``node`` holds while any of the module runs:
  a module-level statement, setUpModule, or a pytest fixture (autouse applies it to every
  test)."""
  if isinstance(node, ast.ClassDef):
    return False
  if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
    return True
  return node.name in ("setUpModule", "setup_module") or any(
      "fixture" in ast.unparse(d) for d in node.decorator_list)


@dataclass(frozen=True)
class Patched:
  """Where a module patches jax.pmap, and the code there that may run under a patch."""
  first: Patch
  # (first line, last line, patch) of each top-level statement a patch may reach
  reached: tuple[tuple[int, int, Patch], ...]

  def patch_at(self, line: int) -> Patch | None:
    """The patch that code at ``line`` may run under, or None."""
    return next((patch for first, last, patch in self.reached if first <= line <= last),
                None)


def patched(text: str, known: frozenset[str] = KNOWN_PATCHERS) -> Patched | None:
  """Where the module ``text`` patches jax.pmap, directly or by calling one of ``known``
  (see ``patchers``), and the code of the module that may run under the patch: each
  top-level function or class that patches, and those it names, transitively (the whole
  module where a patch is module-wide); None where it does not patch."""
  if not (_may_patch(text) or any(name in text for name in known)):
    return None
  try:
    tree = ast.parse(text)
  except (SyntaxError, ValueError):
    return None
  defined = {node.name: node for node in tree.body
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
  reached: dict[ast.stmt, Patch] = {}  # in the order found
  for statement in tree.body:
    here = [p for node in ast.walk(statement) if (p := _patch_at(node, known)) is not None]
    if here:
      reached[statement] = min(here, key=lambda p: (p.line, p.column))
  if not reached:
    return None
  first = min(reached.values(), key=lambda p: (p.line, p.column))
  wide = [patch for statement, patch in reached.items() if _module_wide(statement)]
  if wide:
    return Patched(first, ((1, len(text.splitlines()) + 1, wide[0]),))
  waiting = list(reached)
  while waiting:  # what reached code names among the module's defs is reached too
    statement = waiting.pop()
    for node in ast.walk(statement):
      if (isinstance(node, ast.Name) and node.id in defined
          and defined[node.id] not in reached):
        reached[defined[node.id]] = reached[statement]
        waiting.append(defined[node.id])
  return Patched(first, tuple((*_span(statement), patch)
                              for statement, patch in reached.items()))


@dataclass(frozen=True)
class ModuleReplacement:
  """Code that replaces a module's global ``pmap``: where (``path``, ``line``), how, and the
  dotted name of the module, None where the code does not say (a module passed in)."""
  path: str
  line: int
  how: str
  module: str | None


def _imported_modules(tree: ast.Module) -> dict[str, str]:
  """name -> dotted module (or module attribute) of the module-level imports."""
  names = {}
  for node in tree.body:
    if isinstance(node, ast.Import):
      for alias in node.names:
        names[alias.asname or alias.name.partition(".")[0]] = (
            alias.name if alias.asname else alias.name.partition(".")[0])
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for alias in node.names:
        names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
  return names


def _replaced_module(node: ast.AST, imported: dict[str, str]) -> tuple[str, str | None] | None:
  """(how, module) where ``node`` replaces the ``pmap`` of a module other than jax:
  ``m.pmap = ...``, ``setattr(m, "pmap", ...)``, ``patch.object(m, "pmap", ...)``,
  ``patch("pkg.m.pmap", ...)``; module None where ``m`` is not an imported module."""
  def of(owner: ast.expr) -> tuple[str, str | None] | None:
    try:
      dotted = ast.unparse(owner)
    except ValueError:
      return None
    head, _, rest = dotted.partition(".")
    if not all(part.isidentifier() for part in dotted.split(".")) or head in ("self", "cls"):
      return None
    module = imported.get(head, "jax" if head == "jax" else None)
    module = module and ".".join(filter(None, (module, rest)))
    return None if module == "jax" else (dotted, module)

  if isinstance(node, (ast.Assign, ast.AnnAssign)):
    if isinstance(node.value, ast.Constant) or node.value is None:
      return None  # a setting named pmap (`config.pmap = True`), no function
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    for target in targets:
      if isinstance(target, ast.Attribute) and target.attr == "pmap":
        if (owner := of(target.value)) is not None:
          return f"{owner[0]}.pmap = ...", owner[1]
    return None
  if not isinstance(node, ast.Call):
    return None
  name = _called_name(node.func)
  strings = [_string(arg) for arg in node.args[:2]]
  path = strings[0] if strings else None
  if name in ("patch", "setattr") and path and path.endswith(".pmap") and path != "jax.pmap":
    return f'{name}("{path}", ...)', path.removesuffix(".pmap")
  if (name in ("object", "setattr") and len(strings) == 2 and strings[1] == "pmap"
      and not (len(node.args) > 2 and isinstance(node.args[2], ast.Constant))
      and (owner := of(node.args[0])) is not None):
    return f'{"patch.object" if name == "object" else name}({owner[0]}, "pmap", ...)', owner[1]
  return None


def module_replacements(sources: Iterable[tuple[str, str]]) -> tuple[ModuleReplacement, ...]:
  """Every place the (path, text) ``sources`` of a run replace a module's ``pmap``."""
  found = []
  for path, text in sources:
    if "pmap" not in text:
      continue
    try:
      tree = ast.parse(text)
    except (SyntaxError, ValueError):
      continue
    imported = _imported_modules(tree)
    for node in ast.walk(tree):
      if isinstance(node, ast.stmt | ast.expr) and (
          replaced := _replaced_module(node, imported)) is not None:
        found.append(ModuleReplacement(path, node.lineno, *replaced))
  return tuple(sorted(found, key=lambda r: (r.path, r.line)))


def replacing(path: str, replacements: Iterable[ModuleReplacement]) -> ModuleReplacement | None:
  """The first of ``replacements`` that may replace the ``pmap`` of the module at ``path``:
  one naming it (its dotted name ends the path), or one that does not say which module."""
  stem = os.path.splitext(os.path.abspath(path))[0]
  stem = stem.removesuffix(f"{os.sep}__init__")
  for replacement in replacements:
    if replacement.module is None or stem.endswith(
        os.sep + replacement.module.replace(".", os.sep)):
      return replacement
  return None


def pmap_import_line(text: str) -> int | None:
  """The line of the module-level ``from jax import pmap`` that binds the global name
  ``pmap`` in module ``text``, or None."""
  if "pmap" not in text:
    return None
  try:
    tree = ast.parse(text)
  except (SyntaxError, ValueError):
    return None
  for node in tree.body:
    if (isinstance(node, ast.ImportFrom) and node.module in ("jax", "jax.api")
        and not node.level and any(a.name == "pmap" and a.asname in (None, "pmap")
                                   for a in node.names)):
      return node.lineno
  return None
