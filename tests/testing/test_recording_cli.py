"""`python -m pmap_compat.testing record|check` on jax 0.6.0: exit statuses and reports.

The first tests start the real CLI; the rest call its `main(argv)` in this process
(the same code path, without a JAX start-up per call).
"""
import os

import pytest

from pmap_compat.testing import recordings
from pmap_compat.testing.__main__ import main

from recording_cli import EXAMPLES, cli, copy_example, edit_one_line, output, two_process_job

DP_SGD = os.path.join(EXAMPLES, "dp_sgd.py")


@pytest.fixture(scope="module")
def dp_sgd_recording(tmp_path_factory) -> str:
  """examples/dp_sgd.py's run(steps=2) recorded under legacy jax.pmap."""
  out = str(tmp_path_factory.mktemp("rec") / "dp_sgd")
  r = cli(["record", DP_SGD, "--out", out, "--kwargs", '{"steps": 2}'])
  assert r.returncode == 0, output(r)
  assert "recorded 4 leaves" in r.stdout and "legacy jax.pmap" in r.stdout
  return out


def test_check_of_the_same_program_passes_bit_for_bit(dp_sgd_recording):
  r = cli(["check", DP_SGD, "--against", dp_sgd_recording, "--kwargs", '{"steps": 2}'])
  assert r.returncode == 0, output(r)
  assert "tolerance: bit for bit (same jax 0.6.0 as the recording)" in r.stdout
  assert r.stdout.count("identical") >= 4 and r.stdout.rstrip().endswith(
      "PASS (4 leaves: 4 identical, 0 within tolerance)")


def test_a_one_line_perturbation_fails_with_a_leaf_level_report(dp_sgd_recording, tmp_path):
  program = copy_example("dp_sgd", tmp_path)
  edit_one_line(program, "jnp.ones((), jnp.int32) * x.shape[0]",
                "jnp.ones((), jnp.int32) * (x.shape[0] + 1)")
  r = cli(["check", program, "--against", dp_sgd_recording, "--kwargs", '{"steps": 2}'])
  assert r.returncode == 1, output(r)
  lines = r.stdout.splitlines()
  [bad] = [l for l in lines if "BEYOND TOLERANCE" in l]
  assert bad.split()[:2] == ["['examples_per_step']", "int32[8]"]
  assert "8 of 8 elements differ" in bad and "max abs 8" in bad
  assert lines[-2].startswith("worst leaf: ['examples_per_step']")
  assert lines[-1].startswith("FAIL (1 leaves fail: ['examples_per_step']")


def test_check_under_pmap_compat_patched(dp_sgd_recording):
  r = cli(["check", DP_SGD, "--against", dp_sgd_recording, "--kwargs", '{"steps": 2}',
           "--patched"])
  assert r.returncode == 0, output(r)
  assert "running:  jax 0.6.0 (pmap_compat.pmap)" in r.stdout


def test_a_named_function_and_a_tolerance(tmp_path, capsys):
  program = tmp_path / "scaled_linspace.py"
  program.write_text("import numpy as np\n"
                     "def outputs(scale=1.0):\n"
                     "  return {'x': np.float32(scale) * np.linspace(1, 2, 8, dtype=np.float32)}\n")
  assert main(["record", str(program), "--function", "outputs", "--out", str(tmp_path / "r")]) == 0
  args = ["check", str(program), "--function", "outputs", "--against", str(tmp_path / "r"),
          "--kwargs", '{"scale": 1.0000001}']
  assert main(args) == 1
  capsys.readouterr()
  assert main(args + ["--rtol", "1e-6"]) == 0
  assert "tolerance: max 0 ulp (elementwise or at leaf scale) or rtol 1e-06 (given)" in (
      capsys.readouterr().out)


@pytest.mark.parametrize("args,message", [
    (["check", DP_SGD, "--against", "/nonexistent/rec"], "no recording at /nonexistent/rec"),
    (["record", DP_SGD, "--out", "OUT", "--kwargs", "[1]"], "--kwargs must be a JSON object"),
    (["record", DP_SGD, "--out", "OUT", "--function", "train"],
     "--function 'train': " + DP_SGD + " defines no function 'train'"),
    (["record", "/nonexistent/prog.py", "--out", "OUT"],
     "PROGRAM '/nonexistent/prog.py' is not a file"),
])
def test_nothing_compared_exits_2_naming_the_problem(tmp_path, capsys, args, message):
  assert main([str(tmp_path / "out") if a == "OUT" else a for a in args]) == 2
  assert message in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_multi_process_job_records_and_checks_one_directory_per_process(tmp_path):
  program = os.path.join(EXAMPLES, "multiprocess_sgd.py")
  out = str(tmp_path / "rec")
  recorded = two_process_job(["record", program, "--out", out])
  for i, r in enumerate(recorded):
    assert r.returncode == 0, output(r)
    assert f"into {out}/process_{i} " in r.stdout and r.stdout.startswith(f"[process {i}/2]")
  assert sorted(os.listdir(out)) == ["process_0", "process_1"]
  checked = two_process_job(["check", program, "--against", out])
  for i, r in enumerate(checked):
    assert r.returncode == 0, output(r)
    assert f"[process {i}/2] checking against {out}/process_{i}" in r.stdout
    assert r.stdout.rstrip().endswith("identical, 0 within tolerance)")


GLOBAL_ARRAY_PROGRAM = '''
import os
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

def run():
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(os.environ["PMAP_EXAMPLE_COORDINATOR"], num_processes=2,
                             process_id=int(os.environ["PMAP_EXAMPLE_PROCESS_ID"]))
  mesh = jax.make_mesh((8,), ("i",))
  local = np.arange(12, dtype=np.float32).reshape(4, 3) + 100 * jax.process_index()
  x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), local)
  return {"global": jax.jit(lambda a: a * 2)(x), "local": local * 2}
'''


@pytest.mark.multiprocess
def test_a_global_array_is_recorded_as_this_process_s_block(tmp_path):
  """Converted multi-host code may return global arrays; each process records the part it
  holds, which is what legacy pmap returned there."""
  program = tmp_path / "global_array.py"
  program.write_text(GLOBAL_ARRAY_PROGRAM)
  out = str(tmp_path / "rec")
  for r in two_process_job(["record", str(program), "--out", out]):
    assert r.returncode == 0, output(r)
  for i in range(2):
    leaves = {l.path: l for l in recordings.read(os.path.join(out, f"process_{i}")).leaves}
    assert leaves["['global']"].kind == "jax.Array"
    assert leaves["['global']"].value.tobytes() == leaves["['local']"].value.tobytes()
    assert leaves["['global']"].shape == leaves["['local']"].shape
