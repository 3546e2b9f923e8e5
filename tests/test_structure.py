"""Structure of the three packages: no import cycle among a package's modules,
parameters annotated with types (mypy checks the bodies of annotated functions only),
and JAX-version checks confined to the adapters (jax_line.py).

Imports are read from the source (module-level and function-level ones both
count): ``import a.b``, ``from a import b`` (``a.b`` when it is a module),
``from a.b import name`` and ``importlib.import_module("a.b")`` with a literal
name.  A cycle is reported with the modules on it.
"""
from __future__ import annotations

import ast
import re
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["shard_map_impl", "pmap_compat", "codemod"]


def modules_of(package: str) -> dict[str, Path]:
  found = {}
  for path in sorted((ROOT / package).rglob("*.py")):
    parts = path.relative_to(ROOT).with_suffix("").parts
    name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    found[name] = path
  return found


def _resolve(module: str, level: int, current: str, is_package: bool) -> str:
  if not level:
    return module
  base = current.split(".") if is_package else current.split(".")[:-1]
  base = base[:len(base) - (level - 1)]
  return ".".join([*base, module] if module else base)


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
  """Modules of ``known`` that ``name`` imports anywhere in its source."""
  tree = ast.parse(path.read_text(), filename=str(path))
  is_package = path.name == "__init__.py"
  found: set[str] = set()

  def add(module: str) -> None:
    # ``import a.b.c`` imports a, a.b and a.b.c; keep the deepest known one.
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
      candidate = ".".join(parts[:i])
      if candidate in known:
        found.add(candidate)
        return

  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        add(alias.name)
    elif isinstance(node, ast.ImportFrom):
      base = _resolve(node.module or "", node.level, name, is_package)
      for alias in node.names:
        full = f"{base}.{alias.name}"
        add(full if full in known else base)
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr == "import_module" and node.args
          and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
      add(node.args[0].value)
  found.discard(name)
  return found


def import_graph(package: str) -> dict[str, set[str]]:
  modules = modules_of(package)
  known = set(modules)
  return {name: imported_modules(name, path, known) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import cycle among non-package modules, or None.

  A package's ``__init__`` importing its own submodules is how a package is
  assembled, not a cycle, so edges into ``__init__`` modules are ignored.
  """
  packages = {m for m in graph if (ROOT / Path(*m.split(".")) / "__init__.py").exists()}
  edges = {m: sorted(t for t in ts if t not in packages) for m, ts in graph.items()
           if m not in packages}
  state: dict[str, int] = {}
  stack: list[str] = []

  def visit(m: str) -> list[str] | None:
    state[m] = 1
    stack.append(m)
    for t in edges.get(m, ()):
      if state.get(t) == 1:
        return stack[stack.index(t):] + [t]
      if t not in state:
        cycle = visit(t)
        if cycle:
          return cycle
    stack.pop()
    state[m] = 2
    return None

  for m in sorted(edges):
    if m not in state:
      cycle = visit(m)
      if cycle:
        return cycle
  return None


PENDING = {
    # Owned by other parts of the project; listed here until their owners
    # remove the cycles (strict: the test fails once they are gone).
}


@pytest.mark.parametrize("package", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=PENDING[p]))
    if p in PENDING else p for p in PACKAGES])
def test_no_import_cycle(package):
  cycle = find_cycle(import_graph(package))
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_check_sees_cycles(tmp_path, monkeypatch):
  """The checker finds a function-level cycle (so a pass means something)."""
  pkg = tmp_path / "cyclic"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "a.py").write_text("from cyclic import b\n")
  (pkg / "b.py").write_text("def f():\n  from cyclic.a import g\n")
  monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
  assert find_cycle(import_graph("cyclic")) in (["cyclic.a", "cyclic.b", "cyclic.a"],
                                               ["cyclic.b", "cyclic.a", "cyclic.b"])


def annotated_parameters(package: str) -> tuple[int, int]:
  """(annotated, all) parameters of the package's functions, self and cls left out."""
  annotated = total = 0
  for path in modules_of(package).values():
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
      if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        continue
      a = node.args
      params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
      for p in params:
        if p.arg not in ("self", "cls"):
          total += 1
          annotated += p.annotation is not None
  return annotated, total


@pytest.mark.parametrize("package", ["shard_map_impl", "pmap_compat"])
def test_parameters_are_annotated(package):
  annotated, total = annotated_parameters(package)
  assert annotated >= 0.93 * total, f"{package}: {annotated} of {total} parameters annotated"


def test_annotation_count_sees_bare_parameters(tmp_path, monkeypatch):
  pkg = tmp_path / "bare"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("def f(x, *a: int, k, **kw):\n  pass\n")
  monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
  assert annotated_parameters("bare") == (1, 4)


# Where shard_map_impl and pmap_compat may look at the JAX version: the two adapters
# (everything that differs between the supported lines goes through them) and the
# import-time check. pmap_compat.testing runs on every JAX from 0.4.35, where the adapters
# do not import, and records which version made a recording. (The codemod, which runs on
# any JAX, picks its default target from the installed one.)
VERSION_AWARE = {"shard_map_impl.jax_line", "pmap_compat.jax_line", "shard_map_impl.supported_jax"}
VERSION_AWARE_PACKAGES = ("pmap_compat.testing",)
_VERSION_LITERAL = re.compile(r"\d+\.\d+\.\d+")


def version_checks(path: Path) -> list[str]:
  """Places in a module's source that read or compare a version: `__version__` /
  `__version_info__` of anything, jax.version / jaxlib.version, importlib.metadata's
  version(), and a version literal such as "0.6.0" (beyond a docstring's prose)."""
  tree = ast.parse(path.read_text(), filename=str(path))
  found = []
  for node in ast.walk(tree):
    line = getattr(node, "lineno", 0)
    if isinstance(node, ast.Attribute) and node.attr in ("__version__", "__version_info__"):
      found.append(f"{path.name}:{line}: .{node.attr}")
    elif isinstance(node, ast.Attribute) and node.attr == "version" and isinstance(
        node.value, ast.Name) and node.value.id in ("jax", "jaxlib", "metadata", "importlib"):
      found.append(f"{path.name}:{line}: {node.value.id}.version")
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      module = node.module if isinstance(node, ast.ImportFrom) else None
      names = [f"{module}.{a.name}" if module else a.name for a in node.names]
      found += [f"{path.name}:{line}: import {n}" for n in names
                if n in ("jax.version", "jaxlib.version", "importlib.metadata.version")]
    elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
          and _VERSION_LITERAL.fullmatch(node.value)):
      found.append(f"{path.name}:{line}: {node.value!r}")
  return sorted(found, key=lambda f: int(f.split(":")[1]))


@pytest.mark.parametrize("package", ["shard_map_impl", "pmap_compat"])
def test_only_the_adapters_look_at_the_jax_version(package):
  offenders = [f"{name}: {where}" for name, path in modules_of(package).items()
               if name not in VERSION_AWARE and not name.startswith(VERSION_AWARE_PACKAGES)
               for where in version_checks(path)]
  assert not offenders, (
      "version checks outside the jax_line adapters (put what differs between JAX lines "
      "there): " + "; ".join(offenders))


def test_the_version_check_finds_each_spelling(tmp_path):
  source = tmp_path / "rule.py"
  source.write_text(textwrap.dedent('''
      """Works on jax 0.6.0 and 0.10.2."""
      import jax, jaxlib
      from importlib.metadata import version
      from jax import version as v
      if jax.__version__ == "0.6.0": pass
      if jax.__version_info__ >= (0, 10): pass
      if jaxlib.version.__version__: pass
  '''))
  assert version_checks(source) == [
      "rule.py:4: import importlib.metadata.version", "rule.py:5: import jax.version",
      "rule.py:6: .__version__", "rule.py:6: '0.6.0'", "rule.py:7: .__version_info__",
      "rule.py:8: .__version__", "rule.py:8: jaxlib.version"]
