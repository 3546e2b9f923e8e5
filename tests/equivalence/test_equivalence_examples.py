"""Every shipped example gives the same results on legacy pmap, pmap_compat and codemod output.

For each case in `equivalence.CASES`, each in a fresh process:
  on jax 0.6.0: (a) the example on legacy `jax.pmap`, (b) the same code under
    `pmap_compat.patched()`, (c) the codemod's rewrite for `--target experimental` and
    `--target jax`; every output leaf must match legacy bit for bit;
  on jax 0.10.2: (d) the example as written on 0.10.2's own `jax.pmap`, (e) the
    codemod's `--target jax` rewrite; (e) must match (d) bit for bit where (d) runs,
    and both must match legacy within `pmap_compat.testing`'s cross-version bound;
    (f) the example as written under `pmap_compat.patched()`, bit for bit with (d) where
    (d) runs, within that bound of legacy.
"""
import pytest

import equivalence

# (case or "*", mode) -> why that parametrisation cannot pass yet. Strict: once the
# missing piece lands the test XPASSes, fails, and the entry must be deleted.
XFAIL: dict[tuple[str, str], str] = {}

# Examples that the unconverted program cannot run on jax 0.10.2's jax.pmap, and the
# error that says why. These are limits of JAX 0.10.2, not of this project: the codemod
# output runs them (test_codemod_output_on_the_newest_jax).
NEWEST_PMAP_FAILS = {
    # 0.10.2's pmap is a shard_map over a one-axis mesh; an inner pmap's mesh clashes.
    "nested_data_model": "should match the mesh passed to shard_map",
    # removed from JAX in 0.10.0; the codemod rewrites it.
    "replicate_loop": "jax.device_put_replicated is deprecated",
}


def _case_params():
  return [pytest.param(c, id=c.name, marks=[pytest.mark.slow] if c.slow else [])
          for c in equivalence.CASES]


def _mode_params(case):
  for mode in equivalence.LEGACY_LINE:
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
    per_process = [{l.path: l.value for l in r.leaves} for r in result.recordings()]
    assert [int(p["['process_index']"]) for p in per_process] == list(range(case.processes))
    assert all(int(p["['process_count']"]) == case.processes for p in per_process)
    # The collectives span every process: the all-reduced loss is the same everywhere.
    for p in per_process[1:]:
      assert p["['losses']"].tobytes() == per_process[0]["['losses']"].tobytes()


@pytest.mark.parametrize(
    "case,mode", [p for c in equivalence.CASES for p in _mode_params(c)])
def test_example_matches_legacy(runner, case, mode):
  verdict = runner.compare(case, mode)
  detail = runner.result(case, mode).detail
  if mode.startswith("codemod") and case.codemod_rtol is not None:
    # Within the case's bound, whose mechanism it names; identical on many hosts.
    assert verdict.ok, f"{case.name} under {mode} ({case.codemod_why}): {verdict.message}"
    return
  assert verdict.identical, f"{case.name} under {mode}: {verdict.message}\n{detail[-3000:]}"


@pytest.mark.parametrize("case", _case_params())
def test_unconverted_example_on_the_newest_jax_pmap(runner, case):
  result = runner.result(case, equivalence.NEWEST_PMAP)
  if case.name in NEWEST_PMAP_FAILS:
    assert not result.ok and NEWEST_PMAP_FAILS[case.name] in result.error, (
        f"jax {equivalence.NEWEST_JAX}'s pmap no longer fails on {case.name} as recorded "
        f"here: {result.error}")
    return
  assert result.ok, f"{result.error}\n{result.detail[-3000:]}"
  verdict = runner.compare(case, equivalence.NEWEST_PMAP)
  assert verdict.ok, f"{verdict.message}\n{verdict.report}"


@pytest.mark.parametrize("case", _case_params())
def test_codemod_output_on_the_newest_jax(runner, case):
  result = runner.result(case, equivalence.NEWEST_CODEMOD)
  assert result.ok, f"{result.error}\n{result.detail[-3000:]}"
  verdicts = runner.newest_line(case)
  expected = ["legacy"] if case.name in NEWEST_PMAP_FAILS else [equivalence.NEWEST_PMAP, "legacy"]
  assert [v.against for v in verdicts] == expected
  for verdict in verdicts:
    assert verdict.ok, f"against {verdict.against}: {verdict.message}\n{verdict.report}"
    if verdict.against == equivalence.NEWEST_PMAP:  # same JAX: bit for bit
      assert verdict.identical, verdict.message


@pytest.mark.parametrize("case", _case_params())
def test_unconverted_example_under_pmap_compat_on_the_newest_jax(runner, case):
  """The example as written, under pmap_compat.patched() on jax 0.10.2: bit for bit with
  0.10.2's own jax.pmap where that runs it, within the cross-version bound of legacy."""
  result = runner.result(case, equivalence.NEWEST_PATCHED)
  assert result.ok, f"{result.error}\n{result.detail[-3000:]}"
  verdicts = runner.newest_line(case, equivalence.NEWEST_PATCHED)
  pmap_runs = case.name not in NEWEST_PMAP_FAILS
  assert [v.against for v in verdicts] == ([equivalence.NEWEST_PMAP] if pmap_runs else []) + [
      "legacy"]
  for verdict in verdicts:
    assert verdict.ok, f"against {verdict.against}: {verdict.message}\n{verdict.report}"
    if verdict.against == equivalence.NEWEST_PMAP:  # same JAX: bit for bit
      assert verdict.identical, verdict.message
