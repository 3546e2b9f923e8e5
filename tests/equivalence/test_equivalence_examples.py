"""Every shipped example gives identical results on legacy pmap, pmap_compat and codemod output.

For each case in `equivalence.CASES`: (a) the example on legacy `jax.pmap`, (b) the
same code under `pmap_compat.patched()`, (c) the codemod's rewrite for
`--target experimental` and `--target jax`, each in a fresh process; every output
leaf (and the final state) must match legacy bit for bit, unless the case states a
tolerance and why.
"""
import numpy as np
import pytest

import equivalence

OTHER_MODES = [m for m in equivalence.MODES if m != "legacy"]

# (case or "*", mode) -> why that parametrisation cannot pass yet. Strict: once the
# missing piece lands the test XPASSes, fails, and the entry must be deleted.
XFAIL: dict[tuple[str, str], str] = {}


def _case_params():
  return [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.slow else [])
          for c in equivalence.CASES]


def _mode_params(case):
  for mode in OTHER_MODES:
    reason = XFAIL.get((case.name, mode)) or XFAIL.get(("*", mode))
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    if case.slow:
      marks.append(pytest.mark.slow)
    yield pytest.param(case, mode, id=f"{case.name}-{mode}", marks=marks)


@pytest.mark.parametrize("case", _case_params())
def test_example_runs_under_legacy_pmap(runner, case):
  result = runner.result(case, "legacy")
  assert result.ok, f"{result.error}\n{result.detail}"
  if case.processes > 1:
    per_process = result.value
    assert [p["process_index"] for p in per_process] == list(range(case.processes))
    assert all(p["process_count"] == case.processes for p in per_process)
    # The collectives span every process: the all-reduced loss is the same everywhere.
    for p in per_process[1:]:
      np.testing.assert_array_equal(p["losses"], per_process[0]["losses"])


@pytest.mark.parametrize(
    "case,mode", [p for c in equivalence.CASES for p in _mode_params(c)])
def test_example_matches_legacy(runner, case, mode):
  verdict = runner.compare(case, mode)
  detail = runner.result(case, mode).detail
  assert verdict.identical, f"{case.name} under {mode}: {verdict.message}\n{detail[-3000:]}"
