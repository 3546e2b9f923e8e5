"""Execution: fixture programs run under legacy jax.pmap as written, and as rewritten by the
codemod for --target experimental, --target jax (jax.shard_map via a keyword adapter,
since jax 0.6.0 lacks it), --multihost (one process: the host-local <-> global conversion
is exercised end to end) and --strategy shim; the results must be identical."""
import os

import pytest

from codemod_testing import load, rewrite, support
from support.compare import assert_trees_equal

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
NAMES = sorted(f[:-3] for f in os.listdir(FIXTURES) if f.endswith(".py"))


def _source(name):
  with open(os.path.join(FIXTURES, name + ".py"), encoding="utf-8") as f:
    return f.read()


@pytest.fixture(scope="module")
def legacy_results():
  return {}


MODES = {
    "experimental": {"target": "experimental"},
    "jax": {"target": "jax"},
    "multihost": {"target": "experimental", "multihost": True},
    "shim": {"strategy": "shim"},
}


# The default run covers every fixture for both targets, and each other mode on one
# fixture; `-m slow` adds the rest.
_DEFAULT = {("experimental", n) for n in NAMES} | {("jax", n) for n in NAMES} | {
    ("multihost", "axes_and_forms"), ("shim", "options_and_methods")}
_XFAIL = {("multihost", "keys_and_grads"): (
    "--multihost: multihost_utils' host-local -> global conversion rejects typed PRNG key "
    "arrays, and cannot run under jax.grad around the site (tracers)")}


def _cases():
  for mode in sorted(MODES):
    for name in NAMES:
      marks = [] if (mode, name) in _DEFAULT else [pytest.mark.slow]
      if (mode, name) in _XFAIL:
        marks.append(pytest.mark.xfail(strict=True, reason=_XFAIL[mode, name]))
      yield pytest.param(name, mode, marks=marks, id=f"{name}-{mode}")


@pytest.mark.parametrize("name,target", list(_cases()))
def test_fixture_matches_legacy(name, target, legacy_results):
  source = _source(name)
  new, findings = rewrite(source, **MODES[target])
  errors = [f for f in findings if f.severity.value == "ERROR"]
  assert not errors, errors
  assert "jax.pmap" not in new
  if name not in legacy_results:
    legacy_results[name] = load(source, "legacy_" + name).run()
  ours = load(new, f"rewritten_{name}_{target}", with_jax_shard_map=target == "jax").run()
  assert_trees_equal(legacy_results[name], ours)


def test_fixtures_import_without_building_a_mesh():
  """The rewritten module builds no mesh at import: only the first call does."""
  pmap_mesh = support().pmap_mesh
  pmap_mesh.cache_clear()
  for name in NAMES:
    new, _ = rewrite(_source(name), target="experimental")
    load(new, "import_only_" + name)
    assert pmap_mesh.cache_info().currsize == 0, name
  load(rewrite(_source(NAMES[0]))[0], "called_" + NAMES[0]).run()
  assert pmap_mesh.cache_info().currsize > 0


def test_a_site_evaluated_again_reuses_its_trace():
  """`jax.pmap(f)(x)` in a loop traced f once under legacy pmap; so must the rewrite."""
  source = (
      "import jax\nimport numpy as np\n\nTRACES = []\n\n\n"
      "def f(x):\n  TRACES.append(1)\n  return x * 2\n\n\n"
      "def run():\n  x = np.ones((jax.local_device_count(), 3), np.float32)\n"
      "  return [jax.pmap(f, 'i')(x) for _ in range(3)]\n")
  legacy = load(source, "retrace_legacy")
  expected = legacy.run()
  new, _ = rewrite(source)
  ours = load(new, "retrace_rewritten")
  assert_trees_equal(expected, ours.run())
  assert len(ours.TRACES) == len(legacy.TRACES) == 1


def test_rerun_on_a_converted_file_with_a_new_site_adds_only_missing_imports():
  once, _ = rewrite("import jax\n\ng = jax.pmap(f, 'i')\n")
  twice, _ = rewrite(once + "h = jax.pmap(f, 'i', in_axes=AXES)\n")
  support_imports = [l for l in twice.splitlines() if l.startswith("from pmap_shard_map import")]
  assert len(support_imports) == 1
  assert set(support_imports[0].split(" import ")[1].split(", ")) == {"on_pmap_mesh",
                                                                     "specs_from_axes"}
  assert twice.count("import") == once.count("import")
  module = load(twice.replace("\ng = jax", "\nAXES = 0\nf = abs\ng = jax"), "rerun_imports")
  assert callable(module.h)
