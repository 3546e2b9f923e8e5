"""pytest plugin for running JAX's own suites (`-p jax_suite_plugin`), see runner.py.

Loaded before any test module is imported, so the names the suites bind at import
(`from jax import pmap`, `from jax.experimental.shard_map import shard_map`,
`from jax._src.shard_map import shard_map`) already are ours when
CONFORMANCE_IMPL=ours. It also makes the suite's copy of
`jax._src.internal_test_util` (which the wheels do not ship) importable without
touching the installed jax, and writes each test's outcome to CONFORMANCE_OUT (JSON).
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from typing import Any

import pytest

_outcomes: dict[str, str] = {}
_messages: dict[str, str] = {}  # the crash line of each failure, for reports


def _alias_internal_test_util(folder: str) -> None:
  """`jax._src.internal_test_util` := the suite's copy at `folder` (a package)."""
  import jax._src
  name = "jax._src.internal_test_util"
  spec = importlib.util.spec_from_file_location(
      name, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])
  assert spec is not None and spec.loader is not None
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  setattr(jax._src, "internal_test_util", module)  # noqa: B010 (not a declared attribute)


def _substitute_ours() -> None:
  """Every public and internal name the suites import shard_map / pmap by := ours."""
  import jax
  import pmap_compat
  import shard_map_impl
  jax.pmap = pmap_compat.pmap
  # The suites' test classes call JAX's implementations by their internal names
  # (`self.pmap` is `jax._src.api.pmap`, or `_cpp_pmap`, read when each test runs).
  from jax._src import api as src_api
  for name in ("pmap", "_cpp_pmap", "_python_pmap"):
    if hasattr(src_api, name):
      setattr(src_api, name, pmap_compat.pmap)
  if hasattr(jax, "shard_map"):  # from 0.6.1
    jax.shard_map = shard_map_impl.shard_map
  # Where the suites import it from: jax._src.shard_map from 0.6.1, before that the
  # experimental module (which later releases keep as a deprecated wrapper, left alone).
  core = importlib.util.find_spec("jax._src.shard_map") is not None
  module: Any = importlib.import_module(
      "jax._src.shard_map" if core else "jax.experimental.shard_map")
  module.shard_map = shard_map_impl.shard_map


def pytest_configure(config: pytest.Config) -> None:
  _alias_internal_test_util(os.environ["CONFORMANCE_INTERNAL_TEST_UTIL"])
  if os.environ.get("CONFORMANCE_IMPL") == "ours":
    _substitute_ours()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
  """Proves the substitution reached the names the test modules bound at import."""
  if os.environ.get("CONFORMANCE_IMPL") != "ours":
    return
  import pmap_compat
  import shard_map_impl
  ours = {"pmap": pmap_compat.pmap, "shard_map": shard_map_impl.shard_map}
  modules = {id(m): m for m in (getattr(i, "module", None) for i in items) if m is not None}
  for module in modules.values():
    for name, fn in ours.items():
      if name in vars(module) and vars(module)[name] is not fn:
        raise pytest.UsageError(f"{module.__name__}.{name} is not ours: {vars(module)[name]}")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
  """One outcome per test: the first failing or skipping phase, else passed."""
  previous = _outcomes.get(report.nodeid)
  if previous in ("failed", "skipped"):
    return
  if report.failed:
    _outcomes[report.nodeid] = "failed"
    crash = getattr(report.longrepr, "reprcrash", None)
    _messages[report.nodeid] = (crash.message if crash else str(report.longrepr))[:400]
  elif report.skipped:
    _outcomes[report.nodeid] = "skipped"
  elif report.when == "call":
    _outcomes[report.nodeid] = "passed"


def pytest_collectreport(report: Any) -> None:
  if report.failed:  # a module that fails to import: every case it holds is lost
    _outcomes[report.nodeid or "<collection>"] = "error"


def pytest_sessionfinish(session: pytest.Session) -> None:
  out = os.environ.get("CONFORMANCE_OUT")
  if out and not hasattr(session.config, "workerinput"):  # the xdist controller, or no xdist
    with open(out, "w") as f:
      json.dump({"outcomes": _outcomes, "messages": _messages}, f, indent=0, sort_keys=True)
