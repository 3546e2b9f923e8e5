"""Per-call checking of a program whose loop runs inside one pmap call.

A sampler or a training epoch that loops inside the mapped function compounds rounding
within a single call, so `record` also stores every iteration of every loop inside the
recorded calls (loop_steps, loop_records) and `check --per-call` replays them one by one:
each iteration starts from the recorded carry and is compared with the recorded result.
The program here: a Langevin chain per device (a `while` that settles the start, then a
`scan` of 20 steps with a cross-device `pmean`), under legacy jax.pmap on jax 0.6.0.
"""
import os
import textwrap

import numpy as np
import pytest

from pmap_compat.testing import calls, loop_records
from pmap_compat.testing.comparison import Tolerance
from pmap_compat.testing.loop_steps import Loop
from pmap_compat.testing.__main__ import main
from recording_cli import cli, edit_one_line, output, recorded_program, two_process_job
from support import venvs
from test_per_call import _converted_program

CHAINS = textwrap.dedent('''
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax


    def settle(x):
      return lax.while_loop(lambda c: c[1] < 3,
                            lambda c: (jnp.cos(c[0]) * 0.9 + c[0] * 0.1, c[1] + 1), (x, 0))[0]


    def sample(x, key):
      def step(carry, _):
        x, key = carry
        key, sub = jax.random.split(key)
        grad = lax.pmean(x * jnp.tanh(x), "chains")
        x = x - 0.01 * grad + 0.1 * jax.random.normal(sub, x.shape)
        return (x, key), jnp.sum(x * x)
      (x, key), energy = lax.scan(step, (settle(x), key), None, length=20)
      return x, energy


    def run():
      x = np.linspace(-1.0, 1.0, 8 * 16, dtype=np.float32).reshape(8, 16)
      keys = jax.random.split(jax.random.PRNGKey(0), 8)
      x, energy = jax.pmap(sample, axis_name="chains")(x, keys)
      return {"x": x, "energy": energy}
''')
ITERATIONS = 8 * (3 + 20)  # per device: the while's 3, the scan's 20
LINES = CHAINS.splitlines()
SETTLE_LINE = 1 + next(i for i, l in enumerate(LINES) if "lax.while_loop(" in l)
STEP_LINE = 1 + next(i for i, l in enumerate(LINES) if "lax.scan(" in l)


@pytest.fixture(scope="module")
def chains(tmp_path_factory) -> tuple[str, str]:
  """The program, and its recording under legacy jax.pmap on jax 0.6.0."""
  return recorded_program(tmp_path_factory.mktemp("chains"), "chains", CHAINS, ITERATIONS)


def test_the_recording_holds_each_loop_iteration_per_device(chains):
  _, out = chains
  stored = calls.read(out)
  [site] = stored.sites.values()
  stepped = stored.stepped(site, 0)
  assert stepped is not None
  recorded, outputs = stepped
  assert [(l.number, l.kind, l.depth, l.where) for l in recorded.loops.values()] == [
      (0, "while", 0, f"chains.py:{SETTLE_LINE}"), (1, "scan", 0, f"chains.py:{STEP_LINE}")]
  settle, chain = recorded.loops[0], recorded.loops[1]
  # The while changes both carried values; the scan (no scanned-over operands) both of
  # its carried values (x, key) and returns one value per iteration (the energy).
  assert settle.positions == (0, 1) and chain.positions == (0, 1)
  assert chain.types == {"entry": (((16,), "float32"), ((2,), "uint32")), "input": (),
                         "result": (((16,), "float32"), ((2,), "uint32"), ((), "float32"))}
  assert sorted(recorded.values) == sorted(
      [(0, "entry", d, ()) for d in range(8)] + [(1, "entry", d, ()) for d in range(8)]
      + [(0, "result", d, (i,)) for d in range(8) for i in range(3)]
      + [(1, "result", d, (i,)) for d in range(8) for i in range(20)])
  # The scan's last result is what the call returned: x, and the energy of step 19.
  _, recorded_out = stored.call(site, 0)
  x, energy = (next(leaf.value for leaf in recorded_out.leaves if leaf.path == path)
               for path in ("[0]", "[1]"))
  for device in range(8):
    last = recorded.values[(1, "result", device, (19,))]
    np.testing.assert_array_equal(last[0], x[device])
    np.testing.assert_array_equal(last[2], energy[device, 19])
  # The while's result after 3 iterations is what the scan entered with.
  for device in range(8):
    np.testing.assert_array_equal(recorded.values[(0, "result", device, (2,))][0],
                                  recorded.values[(1, "entry", device, ())][0])
  assert [leaf.path for leaf in outputs.leaves] == ["[0]", "[1]"]


def test_same_jax_replays_every_iteration_bit_for_bit(chains, capsys):
  program, out = chains
  assert main(["check", program, "--against", out, "--per-call"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert "    call 0: identical" in lines
  assert (f"      {ITERATIONS} loop iterations replayed: {ITERATIONS} identical, 0 within "
          "tolerance; the outputs compared are the call's with every iteration replayed") in lines


@pytest.mark.parametrize("mode", ["pmap", "patched", "codemod"])
def test_recorded_on_legacy_checks_iteration_by_iteration_on_jax_0_10_2(chains, tmp_path, mode):
  program, out = chains
  args = {"pmap": [program], "patched": [program, "--patched"],
          "codemod": [_converted_program(program, tmp_path)]}[mode]
  r = cli(["check", *args, "--against", out, "--per-call"], venvs.NEWEST)
  assert r.returncode == 0, output(r)
  lines = r.stdout.splitlines()
  [summary] = [l for l in lines if "loop iterations replayed" in l]
  assert summary.startswith(f"      {ITERATIONS} loop iterations replayed: "), r.stdout
  assert "BEYOND" not in r.stdout
  assert lines[-1].startswith("PASS (1 sites reached, 1 recorded calls replayed:"), r.stdout


def test_a_perturbed_loop_body_is_caught_at_its_first_iteration(chains, tmp_path):
  """One line of the loop body changed in the converted code: the check on jax 0.10.2 names
  the site, the call, the loop and the first iteration on the first device."""
  program, out = chains
  converted = _converted_program(program, tmp_path)
  edit_one_line(converted, "x - 0.01 * grad", "x - 0.0101 * grad")
  r = cli(["check", converted, "--against", out, "--per-call"], venvs.NEWEST)
  assert r.returncode == 1, output(r)
  call = next(l for l in r.stdout.splitlines() if l.startswith("    call 0:"))
  with open(converted, encoding="utf-8") as f:
    line = 1 + next(i for i, l in enumerate(f.read().splitlines()) if "lax.scan(" in l)
  assert call.startswith(f"    call 0: BEYOND TOLERANCE: in its loops: loop 1 (scan at "
                         f"chains.py:{line}) iteration (0) on device 0, result "), call
  assert r.stdout.rstrip().splitlines()[-1].startswith(
      "FAIL (1 calls beyond tolerance, the first: chains:sample call 0;")


def test_without_loop_steps_the_call_is_compared_whole(chains, tmp_path, capsys):
  program, _ = chains
  out = str(tmp_path / "rec")
  assert main(["record", program, "--out", out, "--no-loop-steps"]) == 0
  assert "loop iterations stored" not in capsys.readouterr().out
  stored = calls.read(out)
  [site] = stored.sites.values()
  assert stored.stepped(site, 0) is None
  assert main(["check", program, "--against", out, "--per-call"]) == 0
  text = capsys.readouterr().out
  assert "    call 0: identical" in text and "loop iterations replayed" not in text


def test_the_size_cap_counts_the_iterations(chains, tmp_path, capsys):
  program, _ = chains
  out = str(tmp_path / "rec")
  # The call's inputs and outputs alone fit; with its iterations it does not.
  assert main(["record", program, "--out", out, "--max-call-bytes", "5000"]) == 2
  assert "over the cap of 5,000 (--max-call-bytes / max_call_bytes)" in capsys.readouterr().err
  assert main(["record", program, "--out", out, "--max-call-bytes", "5000",
               "--no-loop-steps"]) == 0
  # A cap the iterations pass even before replicated values are stored once: the recorder
  # stops keeping them as they come (a long loop does not fill the memory first).
  capsys.readouterr()
  assert main(["record", program, "--out", str(tmp_path / "small"),
               "--max-call-bytes", "1000"]) == 2
  err = capsys.readouterr().err
  assert ("its loop iterations alone pass the cap of 1,000 bytes (--max-call-bytes / "
          "max_call_bytes), less the 0 already stored: raise the cap, or store fewer calls per "
          "site with --calls, or store calls whole with --no-loop-steps") in err, err


def test_iterations_the_recording_lacks_are_named(chains, tmp_path, capsys):
  """A longer chain than recorded: the extra iterations run unreplayed and fail the check."""
  program, out = chains
  longer = str(tmp_path / "chains.py")
  with open(longer, "w", encoding="utf-8") as f:
    f.write(CHAINS.replace("length=20", "length=21"))
  assert main(["check", longer, "--against", out, "--per-call"]) == 1
  text = capsys.readouterr().out
  assert ("    call 0: BEYOND TOLERANCE: in its loops: 8 loop steps ran that the recording "
          f"does not have, the first: loop 1 (scan at chains.py:{STEP_LINE}) iteration (20) "
          "(result) on device 0") in text, text


@pytest.mark.parametrize("version", [
    v if v in ("0.4.35", venvs.NEWEST) else pytest.param(v, marks=pytest.mark.slow)
    for v in venvs.RELEASES if v != "0.6.0"])
def test_every_release_records_and_replays_its_own_iterations(tmp_path, version):
  """The stepping rewrite works on every JAX pmap_compat.testing runs on (the oldest and
  the newest in the default tier; 0.6.0 is this suite's own)."""
  program = str(tmp_path / "chains.py")
  with open(program, "w", encoding="utf-8") as f:
    f.write(CHAINS)
  out = str(tmp_path / "rec")
  r = cli(["record", program, "--out", out], version)
  assert r.returncode == 0 and f"{ITERATIONS} loop iterations stored" in r.stdout, output(r)
  r = cli(["check", program, "--against", out, "--per-call"], version)
  assert r.returncode == 0, output(r)
  assert (f"      {ITERATIONS} loop iterations replayed: {ITERATIONS} identical, 0 within "
          "tolerance; the outputs compared are the call's with every iteration replayed") in (
              r.stdout.splitlines())


def test_iteration_differences_are_measured_at_part_scale():
  """An iteration's values are computed together: a difference of one ulp of its largest
  result (60) is within 6 ulp, though it is 64 ulp of the small value's own."""
  loop = Loop(0, "scan", (), (0, 1), {"entry": (), "input": (),
                                      "result": (((), "float32"), ((1,), "float32"))}, "p.py:1")
  results = lambda small: [np.array(60.0, np.float32), np.array([small], np.float32)]  # noqa: E731
  recorded = loop_records.RecordedIterations(
      {0: loop}, {(0, "result", 0, (i,)): results(0.5) for i in range(3)})

  def replayed(smalls):
    replayer = loop_records.IterationReplayer(recorded)
    for i, small in enumerate(smalls):
      back = replayer.step(loop, "result", 0, (i,), results(small))
      assert back is recorded.values[(0, "result", 0, (i,))]  # the run goes on with these
    return replayer

  result = loop_records.check(recorded, replayed([0.5, 0.5 + 2 ** -18, 0.51]),
                              Tolerance(False, 6))
  assert (result.iterations, result.identical, len(result.beyond)) == (3, 1, 1)
  [beyond] = result.beyond
  assert (beyond.path, beyond.index, beyond.status) == ((2,), 1, "beyond")
  assert result.worst is beyond and not result.ok
  within = loop_records.check(recorded, replayed([0.5, 0.5 + 2 ** -18, 0.5]), Tolerance(False, 6))
  assert within.ok and within.worst is not None
  assert (within.worst.max_ulp, within.worst.part_ulp) == (64, 1.0)
  assert within.summary() == "3 loop iterations replayed: 2 identical, 1 within tolerance"
  assert not loop_records.check(recorded, replayed([0.5, 0.5 + 2 ** -18, 0.5]),
                                Tolerance(True)).ok


WIDE = textwrap.dedent('''
    import jax
    import jax.numpy as jnp
    from jax import lax


    def epoch(w):
      def update(w, _):
        return lax.pmean(w * 0.99 + 0.01, "devices"), None
      return lax.scan(update, w, None, length=4)[0]


    def run():
      return jax.pmap(epoch, axis_name="devices")(jnp.ones((8, 300_000), jnp.float32))
''')


@pytest.mark.parametrize("version", [None, venvs.NEWEST])
def test_a_wide_carry_beside_a_collective_does_not_deadlock(tmp_path, version):
  """Each iteration's 1.2 MB carry reaches the host in pieces: as one operand, the CPU
  backend's transfer would wait for the threads the other devices hold at the pmean."""
  program = str(tmp_path / "wide.py")
  with open(program, "w", encoding="utf-8") as f:
    f.write(WIDE)
  out = str(tmp_path / "rec")
  r = cli(["record", program, "--out", out], version, timeout=120)
  assert r.returncode == 0 and "32 loop iterations stored" in r.stdout, output(r)
  r = cli(["check", program, "--against", out, "--per-call"], version, timeout=120)
  assert r.returncode == 0, output(r)
  assert "      32 loop iterations replayed: 32 identical, 0 within tolerance;" in r.stdout
  if version is None:  # the pmean makes every device's weights equal: stored once
    stored = calls.read(out)
    [site] = stored.sites.values()
    call_dir = os.path.join(stored.directory, site.directory, "call_00000")
    with np.load(os.path.join(call_dir, "loops", "loop_000.npz")) as arrays:
      assert "result_0_0" in arrays.files and "same_result_7_0" in arrays.files


SPREAD = textwrap.dedent('''
    import os

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax


    def epoch(w, x):
      def update(w, x_t):
        grad = lax.pmean(jnp.tanh(w * x_t), "devices")  # spans both processes
        return w - 0.1 * grad, jnp.sum(grad)
      return lax.scan(update, w, x)


    def run():
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
      jax.distributed.initialize(os.environ["PMAP_EXAMPLE_COORDINATOR"], num_processes=2,
                                 process_id=int(os.environ["PMAP_EXAMPLE_PROCESS_ID"]))
      n = jax.local_device_count()
      offset = jax.process_index() * n
      w = np.linspace(-1.0, 1.0, 2 * n * 3, dtype=np.float32).reshape(2 * n, 3)[offset:offset + n]
      x = np.cos(np.arange(2 * n * 5 * 3, dtype=np.float32)).reshape(2 * n, 5, 3)[offset:offset + n]
      w, sums = jax.pmap(epoch, axis_name="devices")(w, x)
      return {"w": np.asarray(w), "sums": np.asarray(sums)}
''')


@pytest.mark.multiprocess
def test_a_multi_process_job_records_and_replays_its_loops_per_process(tmp_path):
  """Two processes of 4 devices, the loop's pmean spanning both: each process stores and
  replays its own devices' iterations (devices 0-3 in process 0, 4-7 in process 1)."""
  program = str(tmp_path / "spread.py")
  with open(program, "w", encoding="utf-8") as f:
    f.write(SPREAD)
  out = str(tmp_path / "rec")
  for r in two_process_job(["record", program, "--out", out]):
    assert r.returncode == 0 and "20 loop iterations stored" in r.stdout, output(r)
  for i in range(2):
    stored = calls.read(os.path.join(out, f"process_{i}"))
    [site] = stored.sites.values()
    stepped = stored.stepped(site, 0)
    assert stepped is not None
    assert {key[2] for key in stepped[0].values} == set(range(4 * i, 4 * i + 4))
  for i, r in enumerate(two_process_job(["check", program, "--against", out, "--per-call"])):
    assert r.returncode == 0, output(r)
    assert (f"[process {i}/2]       20 loop iterations replayed: 20 identical, 0 within "
            "tolerance;") in r.stdout, r.stdout
