"""Record on one JAX, check on another: the path a team takes across a JAX upgrade.

Recordings are made by the CLI in the project's other JAX environments
(tests/support/venvs.py) and checked here on jax 0.6.0, and the other way round:
recorded here under legacy jax.pmap, checked as codemod output on jax 0.10.2.
"""
import json
import os
import subprocess
import sys

import pytest

from pmap_compat import testing
from pmap_compat.testing import programs
from pmap_compat.testing.__main__ import main
from recording_cli import EXAMPLES, cli, copy_example, edit_one_line, output
from support import venvs


def _record_on(version: str, example: str, out: str, env: dict | None = None) -> None:
  r = cli(["record", os.path.join(EXAMPLES, example + ".py"), "--out", out], version, env)
  assert r.returncode == 0, output(r)
  assert f"(jax {version}, legacy jax.pmap)" in r.stdout


@pytest.mark.slow
def test_record_on_jax_0_4_38_checks_on_0_6_0(tmp_path, capsys):
  out = str(tmp_path / "rec")
  _record_on("0.4.38", "dropout_prng", out)
  assert testing.load(out).producer["jax"] == "0.4.38"
  program = os.path.join(EXAMPLES, "dropout_prng.py")
  # jax 0.5.0 changed how keys split by default: the check says so and fails...
  assert main(["check", program, "--against", out]) == 1
  assert "note: jax_threefry_partitionable was False when recorded" in capsys.readouterr().out
  # ...and with that flag as it was, 0.6.0 reproduces the 0.4.38 recording.
  r = cli(["check", program, "--against", out], env={"JAX_THREEFRY_PARTITIONABLE": "0"})
  assert r.returncode == 0, output(r)
  assert "recorded: jax 0.4.38 (legacy jax.pmap)" in r.stdout
  assert "default across versions: recorded on jax 0.4.38, running jax 0.6.0" in r.stdout


def test_keys_recorded_on_jax_0_4_35_name_their_implementation_as_later_releases_do(tmp_path):
  """jax 0.4.35's ``str(jax.random.key_impl(k))`` is a tag (``fry``), where later releases
  give the name (``threefry2x32``): the recording stores the name, so the same keys drawn
  on 0.6.0 match them."""
  out = str(tmp_path / "rec")
  _record_on("0.4.35", "dropout_prng", out, env={"JAX_THREEFRY_PARTITIONABLE": "1"})
  keys = [leaf for leaf in testing.load(out).leaves if leaf.key_impl is not None]
  assert keys and {leaf.key_impl for leaf in keys} == {"threefry2x32"}
  r = cli(["check", os.path.join(EXAMPLES, "dropout_prng.py"), "--against", out])
  assert r.returncode == 0, output(r)


def test_record_on_jax_0_7_2_checks_on_0_6_0(tmp_path, capsys):
  out = str(tmp_path / "rec")
  _record_on("0.7.2", "gather_scatter", out)
  assert main(["check", os.path.join(EXAMPLES, "gather_scatter.py"), "--against", out]) == 0
  text = capsys.readouterr().out
  assert "recorded: jax 0.7.2 (legacy jax.pmap)" in text
  assert text.rstrip().splitlines()[-1].startswith("PASS")


def _convert_for_jax(program: str) -> None:
  """The codemod's `--target jax` rewrite of `program`, in place (run on jax 0.6.0)."""
  r = subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", program, "--target", "jax",
                      "--in-place"], capture_output=True, text=True, cwd=venvs.ROOT, timeout=300,
                     check=False)
  assert r.returncode in (0, 1) and "Traceback" not in r.stderr, output(r)
  assert programs.uses_pmap(program) is False, open(program).read()


def test_legacy_recording_checks_against_codemod_output_on_jax_0_10_2(tmp_path):
  recording = str(tmp_path / "legacy")
  module = programs.load_program(os.path.join(EXAMPLES, "gather_scatter.py"))
  assert testing.record(module.run, recording).producer["pmap"] == "legacy jax.pmap"
  converted = copy_example("gather_scatter", tmp_path / "converted")
  _convert_for_jax(converted)

  r = cli(["check", converted, "--against", recording], venvs.NEWEST)
  assert r.returncode == 0, output(r)
  assert "running:  jax 0.10.2 (code that does not call pmap (converted code / shard_map))" in (
      r.stdout)
  assert (f"max {testing.CROSS_VERSION_MAX_ULP} ulp (elementwise or at leaf scale) "
          "(default across versions") in r.stdout
  assert r.stdout.rstrip().splitlines()[-1].startswith("PASS (3 leaves")

  edit_one_line(converted, 'all_gather(loss, "shards")', 'all_gather(loss * 1.001, "shards")')
  r = cli(["check", converted, "--against", recording], venvs.NEWEST)
  assert r.returncode == 1, output(r)
  [bad] = [l for l in r.stdout.splitlines() if "BEYOND TOLERANCE" in l]
  assert bad.split()[0] == "['losses']" and "max ulp" in bad
  assert r.stdout.rstrip().splitlines()[-1].startswith("FAIL (1 leaves fail: ['losses']")


@pytest.mark.slow
@pytest.mark.parametrize("version", venvs.OLDER)
def test_unconverted_pmap_code_on_an_older_jax_matches_legacy_0_6_0(tmp_path, version):
  """The reverse direction: recorded here, checked on an older JAX by that JAX's CLI."""
  recording = str(tmp_path / "legacy")
  module = programs.load_program(os.path.join(EXAMPLES, "dp_sgd.py"))
  testing.record(module.run, recording)
  r = cli(["check", os.path.join(EXAMPLES, "dp_sgd.py"), "--against", recording], version)
  assert r.returncode == 0, output(r)
  assert f"running:  jax {version} (legacy jax.pmap)" in r.stdout


def test_the_testing_module_alone_imports_on_the_newest_jax():
  """pmap_compat's own modules build on jax 0.6.0 internals; `pmap_compat.testing` must not
  pull them in, so that teams can record and check on any JAX."""
  r = venvs.run_python(venvs.NEWEST, ["-c", (
      "import json, sys, pmap_compat, pmap_compat.testing, pmap_compat.testing.__main__; "
      "print(json.dumps(sorted(m for m in sys.modules if m.startswith('pmap_compat'))))")])
  assert r.returncode == 0, output(r)
  loaded = json.loads(r.stdout)
  assert loaded and all(m == "pmap_compat" or m.startswith("pmap_compat.testing") for m in loaded)


def test_the_package_names_still_resolve_on_jax_0_6_0():
  import pmap_compat  # pylint: disable=import-outside-toplevel
  from pmap_compat import api, patching  # pylint: disable=import-outside-toplevel
  assert pmap_compat.pmap is api.pmap and pmap_compat.patched is patching.patched
  assert set(pmap_compat.__all__) <= set(dir(pmap_compat))
  with pytest.raises(AttributeError, match="no attribute 'pnap'"):
    _ = pmap_compat.pnap
