"""Execution: fixture programs run under legacy jax.pmap as written, and as rewritten by the
codemod for --target experimental and --target jax (jax.shard_map via a keyword adapter,
since jax 0.6.0 lacks it); the results must be identical."""
import os

import pytest

from codemod_testing import load, rewrite
from support.compare import assert_trees_equal

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
NAMES = sorted(f[:-3] for f in os.listdir(FIXTURES) if f.endswith(".py"))


def _source(name):
  with open(os.path.join(FIXTURES, name + ".py"), encoding="utf-8") as f:
    return f.read()


@pytest.fixture(scope="module")
def legacy_results():
  return {}


@pytest.mark.parametrize("target", ["experimental", "jax"])
@pytest.mark.parametrize("name", NAMES)
def test_fixture_matches_legacy(name, target, legacy_results):
  source = _source(name)
  new, findings = rewrite(source, target=target)
  errors = [f for f in findings if f.severity.value == "ERROR"]
  assert not errors, errors
  assert "jax.pmap" not in new
  if name not in legacy_results:
    legacy_results[name] = load(source, "legacy_" + name).run()
  ours = load(new, f"rewritten_{name}_{target}", with_jax_shard_map=target == "jax").run()
  assert_trees_equal(legacy_results[name], ours)


def test_fixtures_import_without_starting_the_backend():
  """The rewritten module builds no mesh at import: only the first call does."""
  import jax
  for name in NAMES:
    new, _ = rewrite(_source(name), target="experimental")
    module = load(new, "import_only_" + name)
    assert module._pmap_mesh.cache_info().currsize == 0
  assert jax.device_count() == 8
