"""Finding and running the program whose outputs are recorded or checked."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import os
import sys
from types import ModuleType
from typing import Any
from collections.abc import Callable

import jax

from pmap_compat.testing import supervision


def load_program(program: str) -> ModuleType:
  """Imports PROGRAM: a path to a .py file (its directory goes first on sys.path, so
  files next to it import, as when running it as a script) or a dotted module name."""
  if program.endswith(".py") or os.sep in program:
    path = os.path.abspath(program)
    if not os.path.isfile(path):
      raise FileNotFoundError(f"PROGRAM {program!r} is not a file")
    directory, name = os.path.dirname(path), os.path.splitext(os.path.basename(path))[0]
    if directory not in sys.path:
      sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
      raise ImportError(f"PROGRAM {program!r} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
  else:
    module = importlib.import_module(program)
  supervision.program_imported()  # it may have replaced XLA_FLAGS
  return module


def find_function(module: ModuleType, name: str) -> Callable[..., Any]:
  fn = getattr(module, name, None)
  if not callable(fn):
    where = getattr(module, "__file__", module.__name__)
    raise AttributeError(f"--function {name!r}: {where} defines no function {name!r}")
  return fn


def parse_kwargs(text: str | None) -> dict:
  """The --kwargs JSON object."""
  if not text:
    return {}
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"--kwargs must be a JSON object such as '{{\"steps\": 3}}'; got {text!r} "
                     f"({e})") from None
  if not isinstance(value, dict):
    raise ValueError(f"--kwargs must be a JSON object of keyword arguments, got {text!r}")
  return value


def source_file(fn: Callable[..., Any]) -> str | None:
  try:
    return inspect.getsourcefile(inspect.unwrap(fn))
  except TypeError:
    return None


def uses_pmap(path: str | None) -> bool | None:
  """Whether a source file mentions `pmap` at all (None if it cannot be read). Code the
  codemod converted does not; this tells converted code from pmap code in a recording."""
  if path is None or not os.path.isfile(path):
    return None
  try:
    tree = ast.parse(open(path, encoding="utf-8").read())
  except (SyntaxError, UnicodeDecodeError):
    return None
  for node in ast.walk(tree):
    name = (node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute)
            else node.name if isinstance(node, ast.alias) else None)
    if name is not None and name.split(".")[-1] == "pmap":
      return True
  return False


def run(fn: Callable[..., Any], kwargs: dict) -> Any:
  """Calls fn(**kwargs) and waits for its device work, so failures surface here."""
  return jax.block_until_ready(fn(**kwargs))


def shutdown_distributed() -> None:
  """A multi-process job must leave jax.distributed, else gloo processes can hang at exit."""
  jax_module = sys.modules.get("jax")
  if jax_module is None:
    return
  initialized = getattr(jax_module.distributed, "is_initialized", None)  # jax >= 0.5
  if initialized is None or initialized():
    jax_module.distributed.shutdown()  # a no-op on older jax when not initialized
