"""Executes every Python and shell block of migration_guide.md, so the guide cannot rot.

Each fenced ```python / ```sh block must be preceded by `<!-- block: NAME -->`;
untagged blocks fail the suite instead of being skipped. Python blocks run in a
fresh namespace in this process (8 CPU devices from conftest); shell blocks run
under `bash -euo pipefail` from the repository root with the project's venv first
on PATH. The by-hand blocks assert against legacy jax.pmap themselves.
"""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(ROOT, "migration_guide.md")
TAGGED = re.compile(r"<!-- block: ([\w-]+) -->\n```(python|sh)\n(.*?)\n```", re.S)
FENCE = re.compile(r"^```(python|sh)\s*$", re.M)

# Blocks that need a project piece which does not work yet: strict, so they fail
# (XPASS) as soon as the piece lands and the entry must be deleted.
XFAIL: dict[str, str] = {}


def _blocks():
  with open(GUIDE, encoding="utf-8") as f:
    text = f.read()
  return text, TAGGED.findall(text)


def _params():
  for name, lang, code in _blocks()[1]:
    marks = [pytest.mark.xfail(strict=True, reason=XFAIL[name])] if name in XFAIL else []
    yield pytest.param(lang, code, id=name, marks=marks)


def test_every_code_block_is_tagged_and_unique():
  text, blocks = _blocks()
  assert len(FENCE.findall(text)) == len(blocks), (
      "every ```python / ```sh block in migration_guide.md needs a `<!-- block: NAME -->` line")
  names = [b[0] for b in blocks]
  assert len(set(names)) == len(names), f"duplicate block names: {names}"
  assert set(XFAIL) <= set(names), f"XFAIL names blocks that do not exist: {set(XFAIL) - set(names)}"


def test_guide_has_no_unfilled_placeholders():
  assert "_PLACEHOLDER" not in _blocks()[0]


@pytest.mark.parametrize("lang,code", list(_params()))
def test_guide_block_runs(lang, code):
  if lang == "python":
    exec(compile(code, "migration_guide.md", "exec"), {"__name__": "__guide__"})  # pylint: disable=exec-used
    return
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8",
             PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
  r = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def test_every_test_the_guide_names_exists():
  """`file.py::test_name` (and `::test_name` after it on the same line) must be real tests."""
  text = _blocks()[0]
  defined: dict[str, set[str]] = {}
  for dirpath, _, files in os.walk(os.path.join(ROOT, "tests")):
    for f in files:
      if f.startswith("test_") and f.endswith(".py"):
        with open(os.path.join(dirpath, f), encoding="utf-8") as src:
          defined.setdefault(f, set()).update(re.findall(r"^def (test_\w+)", src.read(), re.M))
  named = []
  for line in text.splitlines():
    current = None
    for file, name in re.findall(r"`(test_\w+\.py)?::(test_\w+)", line):
      current = file or current
      named.append((current, name))
  assert named, "the guide names no tests"
  missing = [f"{f}::{n}" for f, n in named if n not in defined.get(f, set())]
  assert not missing, f"the guide names tests that do not exist: {missing}"


@pytest.mark.multiprocess
def test_multihost_block_runs_unchanged_as_two_processes(tmp_path):
  """The guide says the multi-host block runs unchanged, one process per host: check it."""
  code = dict((name, c) for name, _, c in _blocks()[1])["multihost"]
  prelude = ("import os, jax\n"
             "jax.config.update('jax_cpu_collectives_implementation', 'gloo')\n"
             "jax.distributed.initialize(os.environ['COORD'], num_processes=2,"
             " process_id=int(os.environ['PID']))\n"
             "assert jax.process_count() == 2 and jax.device_count() == 8\n")
  script = tmp_path / "multihost_block.py"
  # Explicit shutdown: with live arrays at interpreter exit, gloo processes can hang there.
  script.write_text(prelude + code + "\nprint('block ok on process', jax.process_index())\n"
                    "jax.distributed.shutdown()\n")
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
  env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4",
             COORD=f"127.0.0.1:{port}")
  procs = [subprocess.Popen([sys.executable, str(script)], env=dict(env, PID=str(i)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  try:
    outs = [p.communicate(timeout=180)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for i, (p, out) in enumerate(zip(procs, outs)):
    assert p.returncode == 0 and f"block ok on process {i}" in out, out[-3000:]
