"""Runs one real program in one mode and writes its results and compile counts.

  python tests/real_programs/run_mode.py PROGRAM MODE OUT_DIR [--kwargs JSON]

Run by a real-programs environment's python (`.venv-real-jax<line>`, see program_catalog.py), in a
fresh interpreter per mode, with 8 CPU devices. Writes OUT_DIR/results.npz (the leaves of
`run()`'s pytree as host arrays, keyed by their path) and OUT_DIR/run.json: the dtypes of
those leaves, the number of XLA compilations per function name (from JAX's compile log),
how many of them went through legacy pmap's own compile path (jax 0.6's pxla), how many
pmaps pmap_compat built, and, in codemod mode, the codemod's report.

Modes (catalog.MODES): `legacy` / `jax_pmap` run the program as it is; `patched_before`
imports the program (and so the library) and runs it inside `pmap_compat.patched()`;
`patched_after` imports it first and enters `patched()` only around the run; `codemod`
copies the library's packages and the program into a temporary directory, converts them
in place with `python -m codemod.pmap_to_shmap` and runs that copy.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from types import ModuleType
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + " --xla_force_host_platform_device_count=8").strip()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import program_catalog as catalog  # noqa: E402

_FINISHED = re.compile(r"Finished XLA compilation of (.+) in [0-9.e+-]+ sec")
# jax 0.6's legacy pmap lowering (pxla.lower_parallel_callable) logs this; jit does not.
_LEGACY_PMAP_COMPILE = re.compile(r"Compiling (.+?) \(\d+\) for \d+ devices with args")


class CompileLog(logging.Handler):
  """Counts JAX's compile-log records by function name.

  It sees the loggers' DEBUG records; only what would have been shown without it (WARNING and
  above) goes on to the root logger's handlers."""

  def __init__(self) -> None:
    super().__init__(logging.DEBUG)
    self.compiles: Counter[str] = Counter()
    self.legacy_pmap: Counter[str] = Counter()

  def emit(self, record: logging.LogRecord) -> None:
    message = record.getMessage()
    if m := _FINISHED.match(message):
      self.compiles[m.group(1)] += 1
    elif m := _LEGACY_PMAP_COMPILE.match(message):
      self.legacy_pmap[m.group(1)] += 1
    if record.levelno >= logging.WARNING:
      logging.getLogger().handle(record)


@contextlib.contextmanager
def counting_compiles() -> Iterator[CompileLog]:
  handler = CompileLog()
  loggers = [logging.getLogger(n) for n in ("jax._src.dispatch", "jax._src.interpreters.pxla")]
  saved = [(lg.level, lg.propagate) for lg in loggers]
  for lg in loggers:
    lg.setLevel(logging.DEBUG)
    lg.propagate = False
    lg.addHandler(handler)
  try:
    yield handler
  finally:
    for lg, (level, propagate) in zip(loggers, saved, strict=True):
      lg.removeHandler(handler)
      lg.setLevel(level)
      lg.propagate = propagate


def load_program(path: str) -> ModuleType:
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  assert spec is not None and spec.loader is not None, path
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


def convert_with_codemod(program: catalog.Program, workdir: str) -> tuple[str, dict[str, Any]]:
  """Copies the program and its libraries' packages into `workdir`, converts them in place.

  Returns the converted program's path and the codemod's exit status and report."""
  targets = []
  for package in program.packages:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
      raise RuntimeError(f"package {package!r} is not installed in {sys.prefix}")
    source = list(spec.submodule_search_locations)[0]
    dest = os.path.join(workdir, package)
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__"))
    targets.append(dest)
  program_copy = os.path.join(workdir, os.path.basename(program.path))
  shutil.copyfile(program.path, program_copy)
  targets.append(program_copy)
  report = os.path.join(workdir, "codemod-report.txt")
  done = subprocess.run(
      [sys.executable, "-m", "codemod.pmap_to_shmap", "--in-place", "--jobs", "1",
       "--support-root", workdir, "--report", report, *targets],
      capture_output=True, text=True, cwd=catalog.ROOT, check=False)
  with open(report, encoding="utf-8") as f:
    report_text = f.read().replace(workdir + os.sep, "")
  if done.returncode not in (0,):
    raise RuntimeError(f"codemod exited {done.returncode}:\n{done.stderr}\n{report_text}")
  return program_copy, {"codemod_exit": done.returncode, "codemod_report": report_text}


def _counting_pmap_compat() -> Counter[str]:
  """Counts the pmaps pmap_compat builds (patched() binds pmap_compat.api.pmap when entered)."""
  import pmap_compat.api  # noqa: PLC0415
  built: Counter[str] = Counter()
  original = pmap_compat.api.pmap

  def counted(fun: Any = None, *args: Any, **kwargs: Any) -> Any:
    built["pmap"] += 1
    return original(fun, *args, **kwargs)

  pmap_compat.api.pmap = counted
  return built


def flatten(tree: Any) -> tuple[dict[str, Any], dict[str, str]]:
  """The leaves of `tree` as host arrays keyed by path; non-numpy dtypes stored as their bits."""
  import jax  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  arrays, dtypes = {}, {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    key = jax.tree_util.keystr(path) or "<root>"
    if hasattr(leaf, "dtype") and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      leaf = jax.random.key_data(leaf)
    value = np.asarray(leaf)
    dtypes[key] = str(value.dtype)
    if value.dtype.type.__module__ != "numpy":  # ml_dtypes (bfloat16, ...): store the bits
      value = value.view(np.dtype(f"u{value.dtype.itemsize}"))
    arrays[key] = value
  return arrays, dtypes


def run(program: catalog.Program, mode: str, out_dir: str, kwargs: dict[str, Any]) -> None:
  import numpy as np  # noqa: PLC0415
  info: dict[str, Any] = {"program": program.name, "mode": mode, "python": sys.executable}
  start = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix=f"real-{program.name}-") as workdir:
    path = program.path
    if mode == "codemod":
      path, codemod_info = convert_with_codemod(program, workdir)
      info.update(codemod_info)
      sys.path.insert(0, workdir)
    built = None
    with counting_compiles() as log:
      if mode in ("patched_before", "patched_after"):
        built = _counting_pmap_compat()
        import pmap_compat  # noqa: PLC0415
      if mode == "patched_before":
        with pmap_compat.patched():
          module = load_program(path)
          result = module.run(**kwargs)
      elif mode == "patched_after":
        module = load_program(path)
        with pmap_compat.patched():
          result = module.run(**kwargs)
      else:
        module = load_program(path)
        result = module.run(**kwargs)
    import jax  # noqa: PLC0415
    info["jax"] = jax.__version__
    info["library_files"] = sorted(
        {p: getattr(sys.modules.get(p), "__file__", None) for p in program.packages}.items())
  arrays, info["dtypes"] = flatten(result)
  info["compiles"] = dict(log.compiles)
  info["legacy_pmap_compiles"] = dict(log.legacy_pmap)
  info["pmap_compat_pmaps"] = None if built is None else built["pmap"]
  info["seconds"] = round(time.perf_counter() - start, 1)
  os.makedirs(out_dir, exist_ok=True)
  np.savez(os.path.join(out_dir, "results.npz"), **arrays)
  with open(os.path.join(out_dir, "run.json"), "w", encoding="utf-8") as f:
    json.dump(info, f, indent=1, sort_keys=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("program", choices=sorted(catalog.PROGRAMS))
  parser.add_argument("mode", choices=catalog.MODES)
  parser.add_argument("out_dir")
  parser.add_argument("--kwargs", default="{}", help="JSON object of run()'s keyword arguments")
  args = parser.parse_args()
  run(catalog.PROGRAMS[args.program], args.mode, args.out_dir, json.loads(args.kwargs))


if __name__ == "__main__":
  main()
