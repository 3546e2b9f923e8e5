"""Execution: each examples/ program, run as written under legacy jax.pmap and as
rewritten by the codemod for both targets, gives identical results."""
import os
import sys

import pytest

from codemod_testing import load, rewrite
from support.compare import assert_trees_equal
from support import venvs

sys.path.insert(0, os.path.join(venvs.ROOT, "tools"))
import equivalence  # noqa: E402  the examples' cases: any codemod-only bound, with its reason

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
SINGLE_PROCESS = sorted(f for f in os.listdir(EXAMPLES)
                        if f.endswith(".py") and not f.startswith("multiprocess"))


def _source(name):
  with open(os.path.join(EXAMPLES, name), encoding="utf-8") as f:
    return f.read()


@pytest.mark.parametrize("target", [
    "experimental", pytest.param("jax", marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", SINGLE_PROCESS)
def test_example_matches_legacy(name, target):
  source = _source(name)
  new, findings = rewrite(source, target=target)
  assert "jax.pmap" not in new
  assert not [f for f in findings if f.severity.value == "ERROR"], findings
  legacy = load(source, "legacy_" + name[:-3]).run()
  ours = load(new, "rewritten_" + name[:-3], with_jax_shard_map=target == "jax").run()
  case = next((c for c in equivalence.CASES if c.module == name[:-3]), None)
  assert_trees_equal(legacy, ours, rtol=case.codemod_rtol if case else None)
