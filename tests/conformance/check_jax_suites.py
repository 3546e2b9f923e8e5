"""The conformance tier: JAX's own shard_map_test.py and pmap_test.py of a release, run
once with JAX's implementation and once with ours substituted (jax_suite_plugin.py), in
that release's environment and JAX's own pytest configuration (jax_suites.py).

Each case passes when ours passes every case JAX's own passes on that release, except
the known failures (strict: one that passes now fails the case, so the list shrinks as
fixes land) and the cases not applicable to a substitute (known_failures.py), and JAX's
own outcome matches the recorded baseline where there is one (within a few cases).

Not named test_*.py: `make test-conformance` (part of `make test`) runs it on its own,
so the main suite's run does not collect it a second time.
"""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax_suites  # noqa: E402

CASES = [
  pytest.param(release, suite, id=f"jax{release}-{suite}",
               # 0.6.0 and the newest run in `make test`; the rest in `make test-all`.
               marks=() if release in (jax_suites.LEGACY, jax_suites.NEWEST)
               else (pytest.mark.slow,))
  for release in jax_suites.RELEASES for suite in jax_suites.SUITES
]


@pytest.mark.parametrize("release, suite", CASES)
def test_ours_passes_what_jax_passes(release: str, suite: str) -> None:
  comparison = jax_suites.run_release(release, suite)
  print(comparison.report())
  problems = comparison.problems()
  assert not problems, "\n".join([comparison.summary(), *problems])
