"""Execution: fixture programs run under legacy jax.pmap as written, and as rewritten by the
codemod for --target experimental, --target jax (jax.shard_map via a keyword adapter,
since jax 0.6.0 lacks it), --multihost (accepted for old command lines; it changes
nothing now) and --strategy shim; the results must be identical."""
import ast
import os
import re

import jax
import numpy as np
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
_XFAIL: dict[tuple[str, str], str] = {}


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


def test_function_level_sites_build_no_mesh_at_import(monkeypatch):
  """A site inside a function gets its mesh built there, and an old-form site builds its
  own on the first call: importing the rewritten module builds no mesh for them. A
  module-level site's mesh is built at import, and the report says so."""
  pmap_mesh = support().pmap_mesh
  pmap_mesh.cache_clear()
  real_mesh = jax.sharding.Mesh
  built = []

  def counting_mesh(*args, **kwargs):
    built.append(args)
    return real_mesh(*args, **kwargs)

  for name in NAMES:
    new, findings = rewrite(_source(name), target="experimental")
    module_level = [line for line in new.splitlines()
                    if re.match(r"\w+ = jax\.sharding\.Mesh\(", line)]
    said = [f for f in findings if "the mesh is built when the module is imported" in f.message]
    assert bool(module_level) == bool(said), (name, module_level, said)
    built.clear()
    with monkeypatch.context() as m:
      m.setattr(jax.sharding, "Mesh", counting_mesh)
      load(new, "import_only_" + name)
    assert len(built) == len(module_level), (name, built)
    assert pmap_mesh.cache_info().currsize == 0, name
  new = rewrite(_source(NAMES[0]))[0]
  built.clear()
  with monkeypatch.context() as m:
    m.setattr(jax.sharding, "Mesh", counting_mesh)
    module = load(new, "called_" + NAMES[0])
    at_import = len(built)
    module.run()
  assert len(built) > at_import


@pytest.mark.parametrize("called", ["half", "half.copy()"])
def test_a_converted_site_over_fewer_rows_than_devices(called):
  """Legacy pmap ran a site over fewer rows than devices (one device per row). Called
  where it is made on names, the converted site's mesh spans those devices too
  (pmap_devices); otherwise it maps over every device of its mesh, JAX says the rows do
  not fill it, and the report says how to get pmap's mesh."""
  source = (
      "import jax\nimport numpy as np\n\n\n"
      "def run():\n  half = np.ones((jax.device_count() // 2, 3), np.float32)\n"
      f"  return jax.pmap(lambda v: jax.lax.psum(v, 'h'), 'h')({called})\n")
  legacy = load(source, "fewer_rows_legacy").run()
  assert legacy.shape == (jax.device_count() // 2, 3)
  np.testing.assert_array_equal(legacy, np.full(legacy.shape, jax.device_count() // 2))
  new, report = rewrite(source)
  assert "placed_on(mesh, P('h'))(" in new and "on_pmap_mesh" not in new
  if called == "half":
    assert "jax.sharding.Mesh(pmap_devices(half), ('h',))" in new
    assert_trees_equal(legacy, load(new, "fewer_rows_rewritten").run())
    return
  assert any("build the mesh over jax.devices()[:rows]" in f.message for f in report)
  with pytest.raises(ValueError, match="should be divisible by"):
    load(new, "fewer_rows_rewritten").run()


def test_a_pmap_transform_maps_each_call_over_its_own_rows():
  """``lambda f: jax.pmap(f, "i")`` (haiku's and chex's test transforms) is pmap partially
  applied: each call of what it makes ran on as many devices as that call's rows, which
  pmap_via_shard_map chooses as legacy did."""
  source = (
      "import jax\nimport numpy as np\n\nPMAP = lambda f: jax.pmap(f, 'i')\n\n\n"
      "def run():\n  total = PMAP(lambda v: jax.lax.psum(v, 'i'))\n"
      "  return [total(np.ones((n, 2), np.float32)) for n in (1, jax.device_count() // 2,\n"
      "                                                      jax.device_count())]\n")
  new, _ = rewrite(source)
  assert "PMAP = lambda f: pmap_via_shard_map(f, 'i')" in new, new
  legacy = load(source, "transform_legacy").run()
  assert [out.shape[0] for out in legacy] == [1, jax.device_count() // 2, jax.device_count()]
  assert_trees_equal(legacy, load(new, "transform_rewritten").run())


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
  imports = [node for node in ast.parse(twice).body
             if isinstance(node, (ast.Import, ast.ImportFrom))]
  support_imports = [node for node in imports if getattr(node, "module", None) == "pmap_shard_map"]
  assert len(support_imports) == 1
  # The new site (axes known only at run time) goes to pmap_via_shard_map: its name joins
  # the plain site's in the one import, and no other import is added.
  assert {a.name for a in support_imports[0].names} == {
      "per_device", "placed_on", "pmap_via_shard_map"}
  added = [ast.unparse(node) for node in imports
           if ast.unparse(node) not in once and node not in support_imports]
  assert added == [], added
  module = load(twice.replace("\nmesh = jax", "\nAXES = 0\nf = abs\nmesh = jax"), "rerun_imports")
  assert callable(module.h)
