"""--target jax output on the newest JAX (0.10.2, run in .venv-jax0.10.2): every fixture and
single-process example, converted by the CLI, gives what 0.10.2's own jax.pmap gives on
the unconverted program, bit for bit. Where that pmap fails (nested pmaps; the removed
device_put_replicated), the converted program must match legacy jax.pmap on jax 0.6.0
within LEGACY_RTOL: XLA versions differ by a few ulp (6e-8 measured on an MNIST MLP with
JAX's own pmap); on these programs the results have been bit-identical so far."""
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest

from support.venvs import NEWEST, ROOT, run_python

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "run_programs.py")
FIXTURES = os.path.join(HERE, "fixtures")
EXAMPLES = os.path.join(ROOT, "examples")
LEGACY_RTOL = 1e-6  # float32: a few ulp (1.2e-7 each)

# The default run covers one program that 0.10.2's pmap runs and one it cannot (nested).
QUICK = {"collectives", "nested_meshes"}


def _programs():
  for name in sorted(os.listdir(FIXTURES)):
    if name.endswith(".py"):
      marks = [] if name[:-3] in QUICK else [pytest.mark.slow]
      yield pytest.param(os.path.join(FIXTURES, name), marks=marks, id=f"fixture-{name[:-3]}")
  for name in sorted(os.listdir(EXAMPLES)):
    if name.endswith(".py") and not name.startswith("multiprocess"):
      yield pytest.param(os.path.join(EXAMPLES, name), marks=[pytest.mark.slow],
                         id=f"example-{name[:-3]}")


def _run(python_version, directory, name, tmp_path):
  out = tmp_path / f"{os.path.basename(directory)}-{python_version}.pkl"
  args = [RUNNER, str(directory), str(out), name]
  if python_version == "legacy":
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT, check=False)
  else:
    proc = run_python(python_version, args, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(out, "rb") as f:
    return pickle.load(f)[name]


def _assert_close(expected, actual, rtol):
  assert [l[:3] for l in expected] == [l[:3] for l in actual], "paths, dtypes or shapes differ"
  for (path, dtype, shape, e), (_, _, _, a) in zip(expected, actual, strict=True):
    e_arr = np.frombuffer(e, dtype=np.dtype(dtype)).reshape(shape)
    a_arr = np.frombuffer(a, dtype=np.dtype(dtype)).reshape(shape)
    if e_arr.dtype.kind == "f":
      np.testing.assert_allclose(a_arr, e_arr, rtol=rtol, atol=0, err_msg=path)
    else:
      assert e == a, path


@pytest.mark.parametrize("program", list(_programs()))
def test_converted_program_on_newest_jax_matches_its_pmap(program, tmp_path):
  name = os.path.basename(program)[:-3]
  original, converted = tmp_path / "original", tmp_path / "converted"
  original.mkdir()
  converted.mkdir()
  shutil.copy(program, original)
  shutil.copy(program, converted)
  # A repository for jax 0.7.2 on: its support copy leaves out the older shard_map's part.
  (converted / "pyproject.toml").write_text(
      '[project]\nname = "converted"\ndependencies = ["jax>=0.7.2"]\n')
  cli = subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", "--target", "jax",
                        "--in-place", str(converted)], capture_output=True, text=True, cwd=ROOT,
                       timeout=120, check=False)
  assert cli.returncode == 0, cli.stderr
  assert " ERROR " not in cli.stderr, cli.stderr
  ours = _run(NEWEST, converted, name, tmp_path)
  assert ours[0] == "ok", ours[1]
  reference = _run(NEWEST, original, name, tmp_path)
  if reference[0] == "ok":
    assert ours[1] == reference[1], "differs from jax 0.10.2's pmap on the same XLA"
  else:  # 0.10.2's pmap cannot run it: legacy pmap on jax 0.6.0 is the reference
    legacy = _run("legacy", original, name, tmp_path)
    assert legacy[0] == "ok", legacy[1]
    _assert_close(legacy[1], ours[1], LEGACY_RTOL)
