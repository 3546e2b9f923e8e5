"""Measures the example rows of migration_guide.md's version matrix on JAX releases.

  .venv/bin/python tools/release_matrix.py OUT.json 0.8.0 0.8.2 ...

For each release (its `.venv-jax<release>` environment, built by `make venvs`) every
example case (tools/equivalence.py CASES) runs in four ways: as written on that release's
`jax.pmap`, under `pmap_compat.patched()`, and as the codemod's output for `--target
experimental` and `--target jax`. Each run is compared with legacy `jax.pmap`'s on jax
0.6.0 (this python) by `pmap_compat.testing.compare_recordings`: within the cross-version
bound off 0.6.0. OUT.json gets, per release and way, the examples whose every case passed
and, for the others, the first failure's message; the run prints the same as the cells
read (`8 of 10 (nested_data_model: ...)`).
"""
from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import equivalence as eq  # noqa: E402

WAYS = ("pmap", "pmap_compat", "codemod-experimental", "codemod-jax")


def measure(releases: list[str], workdir: str, jobs: int = 2) -> dict:
  runner = eq.Runner(workdir)
  modes = [f"jax{release}-{way}" for release in releases for way in WAYS]
  work = [(case, mode) for case in eq.CASES for mode in ["legacy", *modes]]
  with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    list(pool.map(lambda job: runner.result(*job), work))
  found: dict = {}
  for release in releases:
    for way in WAYS:
      failed: dict[str, str] = {}
      examples: collections.Counter = collections.Counter()
      for case in eq.CASES:
        examples[case.module] += 1
        verdict = runner.compare(case, f"jax{release}-{way}")
        if not verdict.ok and case.module not in failed:
          failed[case.module] = verdict.message
      found.setdefault(release, {})[way] = {
          "passed": sorted(set(examples) - set(failed)), "examples": len(examples),
          "failed": failed}
  return found


def cell(result: dict) -> str:
  text = f"{len(result['passed'])} of {result['examples']}"
  if result["failed"]:
    text += " (" + "; ".join(f"{name}: {why[:80]}" for name, why in result["failed"].items()) + ")"
  return text


def main(argv: list[str]) -> int:
  if len(argv) < 2:
    print(__doc__)
    return 2
  out, releases = argv[0], argv[1:]
  with tempfile.TemporaryDirectory(prefix="release-matrix-") as workdir:
    found = measure(releases, workdir)
  with open(out, "w", encoding="utf-8") as f:
    json.dump(found, f, indent=1)
  for release, ways in found.items():
    for way, result in ways.items():
      print(f"{release} {way}: {cell(result)}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
