"""The command is a libcst citizen: `python -m libcst.tool codemod` runs it with its options
(declared with add_args) and shows its findings (reported through the context), with
the same files written and the same findings as the project CLI on the same fixtures."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from support.venvs import ROOT

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
COMMAND = "codemod.convert_pmap.ConvertPmapCommand"


def _copy_fixtures(directory):
  directory.mkdir()
  for name in sorted(os.listdir(FIXTURES)):
    if name.endswith(".py"):
      shutil.copy(os.path.join(FIXTURES, name), directory)
  return directory


def _run(args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("PYTHONPATH", None)
  return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                        env=env, timeout=300, check=False)


def _files(directory):
  return {name: (directory / name).read_text() for name in sorted(os.listdir(directory))
          if name.endswith(".py")}


@pytest.mark.parametrize("flags", [
    ["--target", "experimental"],
    pytest.param(["--target", "jax"], marks=pytest.mark.slow),
    pytest.param(["--target", "experimental", "--multihost"], marks=pytest.mark.slow)])
def test_libcst_runner_and_project_cli_agree(tmp_path, flags):
  ours = _copy_fixtures(tmp_path / "cli")
  theirs = _copy_fixtures(tmp_path / "libcst")
  cli = _run(["-m", "codemod.pmap_to_shmap", "--in-place", *flags, str(ours)])
  assert cli.returncode == 0, cli.stderr
  tool = _run(["-m", "libcst.tool", "codemod", "-x", COMMAND, "--no-format", "-j", "1",
               str(theirs), *flags, "--support-root", str(theirs)])
  assert tool.returncode == 0, tool.stderr
  assert _files(theirs) == _files(ours)
  assert "pmap_shard_map.py" in _files(theirs)

  cli_findings = set()
  for line in cli.stderr.splitlines():
    match = re.match(r"(.+\.py):(\d+:\d+ (?:INFO|WARNING|ERROR) .*)", line)
    if match and not match.group(1).endswith("pmap_shard_map.py"):
      cli_findings.add((os.path.basename(match.group(1)), match.group(2)))
  tool_findings, current = set(), None
  for line in (tool.stdout + tool.stderr).splitlines():
    line = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", line)
    if line.startswith("Codemodding "):
      current = os.path.basename(line.split()[-1])
    elif line.startswith("WARNING: ") and current:
      tool_findings.add((current, line[len("WARNING: "):]))
  assert cli_findings and tool_findings == cli_findings


def test_libcst_runner_without_support_root_warns_that_nothing_wrote_the_module(tmp_path):
  theirs = _copy_fixtures(tmp_path / "libcst")
  tool = _run(["-m", "libcst.tool", "codemod", "-x", COMMAND, "--no-format", "-j", "1",
               str(theirs / "collectives.py"), "--target", "jax"])
  assert tool.returncode == 0, tool.stderr
  assert "import pmap_shard_map, which this run does not write: pass --support-root" in (
      tool.stdout + tool.stderr)
  assert not (theirs / "pmap_shard_map.py").exists()
