"""A short smoke per JAX release the project builds an environment for (`make test`).

The full suites run on jax 0.6.0 and 0.10.2; on every other release (and 0.10.2 again)
tests/support/release_smoke.py runs in that release's environment (tests/support/venvs.py)
one program per part of the project:

* the imports of both packages, or, on a JAX they cannot run on (no varying-manual-axes
  types), their stop at import with a message naming this release and what to install;
* ``shard_map_impl.shard_map`` against that release's own shard_map (``jax.shard_map``,
  or ``jax.experimental.shard_map.shard_map`` before it existed), values and gradient;
* ``pmap_compat.pmap`` against legacy ``jax.pmap`` where the release still has it (on
  0.8–0.9 legacy is built with ``jax_pmap_shmap_merge`` off), else the release's own
  ``jax.pmap``: bit for bit, the same kind of output sharding, first and steady-state
  calls;
* the codemod's output of a collectives program (with the target the release's shard_map
  takes) against the unconverted program on that same reference pmap.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from support import release_smoke
from support.venvs import LEGACY, RELEASES, ROOT, run_python

OTHER_RELEASES = [v for v in RELEASES if v != LEGACY]


def _release_key(version: str) -> tuple[int, ...]:
  return tuple(int(p) for p in version.split("."))


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> str:
  """The codemod program converted with each target (by this environment's CLI)."""
  root = tmp_path_factory.mktemp("converted")
  for target in release_smoke.TARGETS:
    os.makedirs(root / target)
    shutil.copy(release_smoke.CODEMOD_PROGRAM, root / target)
    cli = subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", "--target", target,
                          "--in-place", str(root / target)], capture_output=True, text=True,
                         cwd=ROOT, timeout=120, check=False)
    assert cli.returncode == 0 and " ERROR " not in cli.stderr, cli.stderr
  return str(root)


@pytest.mark.parametrize("version", OTHER_RELEASES)
def test_release_smoke(version: str, converted: str) -> None:
  # JAX's test policy, ours too: a DeprecationWarning anywhere on the way is an error.
  proc = run_python(version, ["-W", "error::DeprecationWarning", release_smoke.__file__, converted],
                    timeout=600)
  assert proc.returncode == 0, f"jax {version}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  assert report["jax"] == version
  stopped = report.get("stopped_at_import")
  if stopped is not None:
    # The contract where the packages cannot run: a stop that names this release and the
    # release to install instead.
    assert f"this is jax {version}" in stopped and re.search(r"Install jax==\S+", stopped), (
        f"jax {version}: an unclear stop at import: {stopped}")
    return
  # Legacy's PmapSharding outputs wherever legacy pmap exists, whatever the flag says.
  assert report["pmap"]["sharding"] == (
      "PmapSharding" if report["legacy_pmap"] else "NamedSharding"), report


def test_smoke_covers_every_environment_make_test_builds() -> None:
  """The Makefile's extra environments are exactly the releases smoked here."""
  with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as f:
    makefile = f.read()
  listed = re.search(r"^EXTRA_JAX := (.*)$", makefile, re.M)
  assert listed is not None, "the Makefile no longer says EXTRA_JAX := ..."
  extra = listed.group(1).replace("$(NEWEST_JAX)", RELEASES[-1]).split()
  assert sorted(extra, key=_release_key) == OTHER_RELEASES
  assert OTHER_RELEASES == sorted(OTHER_RELEASES, key=_release_key)
