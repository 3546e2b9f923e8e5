"""`record` / `check` give a verdict on a loaded machine, never XLA's abort.

On the CPU backend a device is a thread and a collective waits for every device thread;
XLA ends the process when one is late past its limit (jax 0.7 on: a warning after 20 s,
the abort after a termination timeout, 40 s by default, which jaxlib 0.8 on lets
XLA_FLAGS set; jax 0.6.0 waits without a limit). The command line raises that limit
where XLA lets it, also after a program replaced XLA_FLAGS, and turns an abort still
reached into a verdict: exit status 2 and a message naming the collective and what to
do (pmap_compat/testing/supervision.py).

The fast tests make a device late on purpose (its host callback sleeps before a psum)
and compare with what XLA itself does to the same program outside the command line. The
`slow` ones run the Flax ImageNet example and a loop with a collective inside (stepped
with host callbacks by `record`) while busy processes hold every core.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from pmap_compat.testing import supervision
from recording_cli import output
from support import venvs

sys.path.insert(0, os.path.join(venvs.ROOT, "tests", "real_programs"))
import program_catalog as catalog  # noqa: E402  pylint: disable=wrong-import-position

FLAG = supervision.TERMINATE_FLAG
WARN_FLAG = "xla_cpu_collective_call_warn_stuck_timeout_seconds"

# Device 7 waits `delay` seconds (None: for ever, a deadlock) in a host callback before a
# psum the others wait at. The program sets XLA_FLAGS itself, as programs do, dropping what
# the command line put there (and, given `warn`, asks XLA to warn after 1 s instead of 20,
# so the limit is reached soon: a flag jax 0.6.0's XLA, which has no limit, lacks).
LATE_DEVICE = '''
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8{warn}"
import threading
import jax
import jax.numpy as jnp
from jax import lax


def run(delay=0.0):
  def host(i, x):
    if int(i) == 7:
      threading.Event().wait(delay)
    return x

  def step(x):
    y = jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype),
                          lax.axis_index("i"), x)
    return lax.psum(y, "i")

  return jax.pmap(step, "i")(jnp.arange(8.0))
'''


def _late_device(tmp_path, warn: bool = True) -> str:
  program = tmp_path / "late_device.py"
  program.write_text(LATE_DEVICE.format(warn=f" --{WARN_FLAG}=1" if warn else ""))
  return str(program)


def _record(version: str, program: str, out: str, *extra: str,
            timeout: float = 300) -> subprocess.CompletedProcess:
  return venvs.run_python(version, ["-W", "error::DeprecationWarning", "-m",
                                    "pmap_compat.testing", "record", program, "--out", out,
                                    *extra], timeout=timeout)


def _starts_jax(version: str, xla_flags: str) -> subprocess.CompletedProcess:
  return venvs.run_python(version, ["-c", "import jax; print(jax.devices())"],
                          env={"XLA_FLAGS": xla_flags})


def test_the_flag_is_asked_of_xla_as_starting_jax_answers():
  """`xla_knows` answers as XLA does when JAX starts with the flag (it aborts on a flag it
  does not know): on the release lines with and without it."""
  answers = {}
  for version in (venvs.LEGACY, "0.7.2", venvs.NEWEST):
    for flag in (FLAG, "xla_cpu_no_such_flag_for_this_test"):
      started = _starts_jax(version, f"--xla_force_host_platform_device_count=8 --{flag}=600")
      answers[version, flag] = supervision.xla_knows(flag, venvs.python_for(version))
      assert answers[version, flag] == (started.returncode == 0), (version, flag,
                                                                     output(started))
  assert set(answers.values()) == {True, False}, answers  # both answers occur


@pytest.mark.parametrize("xla_flags", [
    "", "--xla_force_host_platform_device_count=8",
    f"--xla_force_host_platform_device_count=8 --{FLAG}=90",
    f"--{FLAG}=5 --xla_force_host_platform_device_count=8 --{FLAG}=90"])
def test_the_flag_is_added_to_xla_flags_unless_they_set_it(xla_flags):
  merged = supervision.with_flag(xla_flags, FLAG, 600)
  given = supervision.flag_value(xla_flags, FLAG)
  assert supervision.flag_value(merged, FLAG) == (given if given is not None else "600")
  assert merged.split()[:len(xla_flags.split())] == xla_flags.split()  # theirs, as they were


def test_a_device_late_past_the_limit_gives_a_verdict_where_xla_aborts(tmp_path):
  """jax 0.10.2: with --collective-timeout 2, a device 6 s late ends the run. Run directly,
  XLA aborts the same program with a C++ stack trace (SIGABRT); the command line exits
  with 2 and says which collective waited, for how many devices, and what to do. That
  the limit was 2 s also shows the flag reached XLA though the program replaced XLA_FLAGS
  at import (with XLA's default the run would have passed)."""
  program = _late_device(tmp_path)
  direct = venvs.run_python(venvs.NEWEST, ["-c", f"""
import os, sys
sys.path.insert(0, {str(tmp_path)!r})
import late_device
os.environ["XLA_FLAGS"] += " --{FLAG}=2"
late_device.run(delay=6.0).block_until_ready()
"""])
  assert direct.returncode == -signal.SIGABRT, output(direct)
  assert "Termination timeout for `all reduce" in direct.stderr
  r = _record(venvs.NEWEST, program, str(tmp_path / "rec"), "--kwargs", '{"delay": 6}',
              "--collective-timeout", "2")
  assert r.returncode == 2, output(r)
  last = r.stderr.strip().splitlines()[-3:]
  assert last[0].startswith("error: XLA ended the run: a collective of the program (all "
                            "reduce) on the CPU backend: it waited 3 s for its last device "
                            "(7 of 8 devices had arrived)"), r.stderr
  assert last[1].endswith("nothing was recorded."), r.stderr
  assert last[2].startswith("hint: run it again on a less loaded machine, or give "
                            "collectives longer with --collective-timeout SECONDS (this run: "
                            "2 s)"), r.stderr
  assert not os.path.exists(tmp_path / "rec" / "manifest.json")


def test_a_device_late_within_the_limit_is_waited_for(tmp_path):
  program = _late_device(tmp_path)
  r = _record(venvs.NEWEST, program, str(tmp_path / "rec"), "--kwargs", '{"delay": 4}',
              "--collective-timeout", "30")
  assert r.returncode == 0, output(r)
  assert "may be stuck" in r.stderr  # XLA's warning, after 1 s: the device was late
  assert "recorded 1 leaves of" in r.stdout


def test_without_the_flag_the_command_line_adds_none(tmp_path):
  """jax 0.6.0's XLA has no such flag (and no limit): the command line leaves XLA_FLAGS
  as they were, which would otherwise abort at start ("Unknown flag")."""
  program = str(tmp_path / "flags.py")
  with open(program, "w", encoding="utf-8") as f:
    f.write("import os\n\ndef run():\n  print('XLA_FLAGS:', os.environ.get('XLA_FLAGS'))\n"
            "  return 1.0\n")
  for version in (venvs.LEGACY, venvs.NEWEST):
    r = _record(version, program, str(tmp_path / version))
    assert r.returncode == 0, output(r)
    flags = next(l for l in r.stdout.splitlines() if l.startswith("XLA_FLAGS:"))
    known = supervision.xla_knows(FLAG, venvs.python_for(version))
    assert (f"--{FLAG}={supervision.DEFAULT_TIMEOUT_S}" in flags) == known, (version, flags)


def test_interpreters_the_command_line_starts_set_the_limit_again_after_the_import(tmp_path):
  """`check --calibrate` runs the program in a fresh interpreter: there too the limit is
  set again once the program replaced XLA_FLAGS at import."""
  program = _late_device(tmp_path)
  r = venvs.run_python(venvs.NEWEST, ["-c", f"""
import os
from pmap_compat.testing import programs
programs.load_program({program!r})
print(os.environ["XLA_FLAGS"])
"""], env={"PMAP_COMPAT_TESTING_COLLECTIVE_TIMEOUT": f"{FLAG}=77", "PYTHONPATH": venvs.ROOT})
  assert r.returncode == 0, output(r)
  assert r.stdout.split() == ["--xla_force_host_platform_device_count=8", f"--{WARN_FLAG}=1",
                              f"--{FLAG}=77"], r.stdout


@pytest.fixture(scope="module")
def xla_abort_lines(tmp_path_factory) -> list[str]:
  """What XLA writes to stderr when a device is late past its limit (jax 0.10.2)."""
  directory = tmp_path_factory.mktemp("late")
  _late_device(directory)
  direct = venvs.run_python(venvs.NEWEST, ["-c", f"""
import os, sys
sys.path.insert(0, {str(directory)!r})
import late_device
os.environ["XLA_FLAGS"] += " --{FLAG}=1"
late_device.run(delay=4.0).block_until_ready()
"""])
  assert direct.returncode == -signal.SIGABRT, output(direct)
  return direct.stderr.splitlines()


def test_the_hint_where_this_jaxlib_cannot_lengthen_the_limit(xla_abort_lines):
  text = supervision.diagnose(signal.SIGABRT, xla_abort_lines,
                              supervision.CollectiveTimeout(600, None), "check")
  assert "it waited 2 s for its last device (7 of 8 devices had arrived)" in text, text
  assert text.splitlines()[-1].startswith(
      f"hint: this jaxlib has no flag to lengthen that limit (XLA_FLAGS --{FLAG} is unknown "
      "to it)"), text
  assert "nothing was checked" in text


def test_the_hint_where_the_program_started_jax_with_its_own_flags(xla_abort_lines):
  timeout = supervision.CollectiveTimeout(600, FLAG, replaced_by_program=True)
  text = supervision.diagnose(signal.SIGABRT, xla_abort_lines, timeout, "record")
  assert text.splitlines()[-1] == (
      "hint: the limit asked for (600 s, --collective-timeout) was not in effect: the "
      "program sets XLA_FLAGS itself, and JAX started with its flags; add "
      f"--{FLAG}=600 to them"), text


def test_another_signal_is_named(tmp_path):
  program = str(tmp_path / "crash.py")
  with open(program, "w", encoding="utf-8") as f:
    f.write("import os, signal\n\ndef run():\n  os.kill(os.getpid(), signal.SIGSEGV)\n")
  r = _record(venvs.LEGACY, program, str(tmp_path / "rec"))
  assert r.returncode == 2, output(r)
  assert r.stderr.strip().splitlines()[-2:] == ["error: the run died from SIGSEGV",
                                                "nothing was recorded"], r.stderr


def test_the_run_ends_with_the_command_line(tmp_path):
  """Killing the command line (a test's timeout does) ends the process running the
  program too."""
  program = str(tmp_path / "sleeps.py")
  marker = tmp_path / "pid"
  with open(program, "w", encoding="utf-8") as f:
    f.write(f"import os, time\n\ndef run():\n  open({str(marker)!r}, 'w').write("
            "str(os.getpid()))\n  time.sleep(120)\n  return 1.0\n")
  cli = subprocess.Popen([venvs.python_for(venvs.LEGACY), "-m", "pmap_compat.testing",
                          "record", program, "--out", str(tmp_path / "rec")],
                         cwd=venvs.ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    deadline = time.monotonic() + 120
    while not marker.exists() or not marker.read_text():
      assert cli.poll() is None and time.monotonic() < deadline
      time.sleep(0.2)
    running = int(marker.read_text())
    assert running != cli.pid  # the program runs in a child of the command line
    cli.kill()
    cli.wait()
    deadline = time.monotonic() + 20
    while _alive(running) and time.monotonic() < deadline:
      time.sleep(0.2)
    assert not _alive(running)
  finally:
    if cli.poll() is None:
      cli.kill()


def _stuck_verdict(r: subprocess.CompletedProcess, seconds: int) -> None:
  assert r.returncode == 2, output(r)
  error, hint = r.stderr.strip().splitlines()[-2:]
  assert error.startswith("error: the run was stuck: for "), r.stderr
  assert error.endswith("That says nothing about the results: nothing was recorded."), r.stderr
  assert hint == ("hint: a program that waits that long on purpose needs a longer limit: "
                  f"--collective-timeout SECONDS (this run: {seconds} s)"), r.stderr


def test_a_deadlock_xla_waits_out_forever_ends_with_a_verdict(tmp_path):
  """jax 0.6.0 has no limit on a collective's wait: the supervisor ends a run whose
  processes stopped using the CPU (here for 2 x 2 s), and says so."""
  program = _late_device(tmp_path, warn=False)
  started = time.monotonic()
  r = _record(venvs.LEGACY, program, str(tmp_path / "rec"), "--kwargs", '{"delay": null}',
              "--collective-timeout", "2", timeout=240)
  _stuck_verdict(r, 2)
  assert time.monotonic() - started < 120
  assert not os.path.exists(tmp_path / "rec" / "manifest.json")


def test_a_program_waiting_outside_jax_ends_with_a_verdict(tmp_path):
  """A wait XLA's limit cannot see (no collective): on every release."""
  program = tmp_path / "waits.py"
  program.write_text("import threading\n\n\ndef run():\n  threading.Event().wait()\n")
  for version in (venvs.LEGACY, venvs.NEWEST):
    _stuck_verdict(_record(version, str(program), str(tmp_path / version),
                           "--collective-timeout", "2", timeout=240), 2)


def test_a_busy_run_past_the_limit_is_not_ended(tmp_path):
  """A run that uses the CPU is running, however long it takes."""
  program = tmp_path / "busy.py"
  program.write_text("import time\n\n\ndef run():\n  end = time.time() + 15\n"
                     "  while time.time() < end:\n    pass\n  return 1.0\n")
  r = _record(venvs.LEGACY, str(program), str(tmp_path / "rec"), "--collective-timeout", "2")
  assert r.returncode == 0, output(r)


# The command line as where a process cannot fork (not Linux): it supervises the command
# run in a new interpreter.
WITHOUT_FORK = """
import sys
from pmap_compat.testing.__main__ import main
sys.exit(main(sys.argv[1:], supervised=True, fork=False))
"""


def _without_fork(version: str, *argv: str) -> subprocess.CompletedProcess:
  return venvs.run_python(version, ["-W", "error::DeprecationWarning", "-c", WITHOUT_FORK,
                                    *argv], timeout=300)


def test_without_fork_xla_abort_still_gives_a_verdict(tmp_path):
  """The late device of the test above, supervised from a new interpreter: the same
  verdict, and the limit set there too."""
  program = _late_device(tmp_path)
  r = _without_fork(venvs.NEWEST, "record", program, "--out", str(tmp_path / "rec"),
                    "--kwargs", '{"delay": 6}', "--collective-timeout", "2")
  assert r.returncode == 2, output(r)
  assert "Termination timeout for `all reduce" in r.stderr  # XLA's own lines, passed on
  last = r.stderr.strip().splitlines()[-3:]
  assert last[0].startswith("error: XLA ended the run: a collective of the program (all "
                            "reduce) on the CPU backend: it waited 3 s"), r.stderr
  assert last[1].endswith("nothing was recorded."), r.stderr


def test_without_fork_a_new_interpreter_runs_the_command_as_given(tmp_path):
  """The command runs in a new interpreter (marked, and with this one's warning options),
  and its status and output are the command's."""
  program = tmp_path / "where.py"
  program.write_text("import os, sys\n\n\ndef run():\n"
                     "  print('child:', os.environ.get('PMAP_COMPAT_TESTING_SUPERVISED'),"
                     " sys.warnoptions)\n  return 1.0\n")
  r = _without_fork(venvs.LEGACY, "record", str(program), "--out", str(tmp_path / "rec"))
  assert r.returncode == 0, output(r)
  assert "child: 1 ['error::DeprecationWarning']" in r.stdout, r.stdout
  assert "recorded 1 leaves of" in r.stdout


def test_without_fork_a_stuck_run_ends_with_a_verdict(tmp_path):
  program = _late_device(tmp_path, warn=False)
  _stuck_verdict(_without_fork(venvs.LEGACY, "record", program, "--out", str(tmp_path / "rec"),
                               "--kwargs", '{"delay": null}', "--collective-timeout", "2"), 2)


def test_cpu_seconds_counts_the_processes_a_run_started(tmp_path):
  """A process whose child used 2 s of CPU time (of its own clock, whatever the load)
  and then waits: the child's time counts. /proc counts in clock ticks, sampled, so it
  may read a few ticks under the child's own clock: the bound leaves room for that."""
  marker = tmp_path / "spun"
  grandchild = ("import time\nwhile time.process_time() < 2.0:\n  pass\n"
                f"open({str(marker)!r}, 'w').close()\ntime.sleep(60)\n")
  child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run("
                            f"[sys.executable, '-c', {grandchild!r}])"])
  try:
    deadline = time.monotonic() + 120
    while not marker.exists():
      assert time.monotonic() < deadline
      time.sleep(0.2)
    used = supervision.cpu_seconds(child.pid)
    assert used is not None and used >= 1.5, used
  finally:
    supervision.end_tree(child.pid)
    child.wait()
  assert supervision.cpu_seconds(child.pid) is None  # gone


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().split(")")[-1].split()[0] != "Z"
  except FileNotFoundError:
    return False


# --------------------------------------------------------------------------- contention


@contextlib.contextmanager
def busy_cores(seconds: float) -> Iterator[None]:
  """Two busy processes per core for at most `seconds` (they end by themselves)."""
  loop = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end:\n  pass\n"
  procs = [subprocess.Popen([sys.executable, "-c", loop])
           for _ in range(2 * (os.cpu_count() or 1))]
  try:
    yield
  finally:
    for p in procs:
      p.kill()
      p.wait()


def _verdict(r: subprocess.CompletedProcess) -> str:
  assert r.returncode in (0, 1), output(r)
  assert "error: XLA ended the run" not in r.stderr, output(r)
  last = r.stdout.strip().splitlines()[-1]
  assert last.startswith(("PASS", "FAIL")), output(r)
  return last


# A loop with a collective in every iteration, inside one pmap call: `record` and
# `check --per-call` step it, with a host callback per device and iteration.
SCAN_PMEAN = '''
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def step(w, x):
  def body(carry, xi):
    g = jnp.tanh(carry @ xi)
    return carry - 0.01 * lax.pmean(g, "batch"), jnp.sum(g)
  return lax.scan(body, w, x)


p_step = jax.pmap(step, axis_name="batch")


def run(iterations: int = 100, width: int = 64):
  n = jax.local_device_count()
  rng = np.random.default_rng(0)
  w = np.broadcast_to(np.eye(width, dtype=np.float32), (n, width, width)).copy()
  x = (rng.normal(size=(n, iterations, width, width)) * 0.1).astype(np.float32)
  w, s = p_step(w, x)
  return {"w": np.asarray(w), "s": np.asarray(s)}
'''


@pytest.mark.slow
def test_a_collective_loop_records_and_checks_under_contention(tmp_path):
  """Recorded on jax 0.6.0, checked per call (every iteration replayed) on the same
  release and on 0.10.2, three times each, while every core is busy: a verdict each time."""
  program = str(tmp_path / "scan_pmean.py")
  with open(program, "w", encoding="utf-8") as f:
    f.write(SCAN_PMEAN)
  out = str(tmp_path / "rec")
  with busy_cores(900):
    r = _record(venvs.LEGACY, program, out, timeout=600)
    assert r.returncode == 0, output(r)
    assert "1 of those calls hold loops: 800 loop iterations stored" in r.stdout, r.stdout
    for _ in range(3):
      for version in (venvs.LEGACY, venvs.NEWEST):
        check = venvs.run_python(version, [
            "-W", "error::DeprecationWarning", "-m", "pmap_compat.testing", "check", program,
            "--against", out, "--per-call", "--max-ulp", "64"], timeout=600)
        assert _verdict(check).startswith("PASS"), output(check)


def _real_cli(line: str, args: list[str]) -> subprocess.CompletedProcess:
  """The command line in the real-programs environment of jax `line`."""
  return subprocess.run([catalog.python_for(line), "-m", "pmap_compat.testing", *args],
                        env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=venvs.ROOT,
                                 XLA_FLAGS="--xla_force_host_platform_device_count=8"),
                        cwd=venvs.ROOT, capture_output=True, text=True, timeout=1800,
                        check=False)


@pytest.mark.slow
def test_the_flax_imagenet_example_records_and_checks_under_contention(tmp_path):
  """The case of issue 32: the Flax ImageNet example recorded under legacy jax.pmap on
  0.6.0, `check --per-call --patched` on 0.10.2, while every core is busy."""
  program = catalog.PROGRAMS["flax_imagenet"].path
  out = str(tmp_path / "legacy")
  with busy_cores(2400):
    r = _real_cli(catalog.LEGACY_LINE, ["record", program, "--out", out])
    assert r.returncode == 0, output(r)
    check = _real_cli(catalog.NEWEST_LINE, ["check", program, "--against", out, "--per-call",
                                            "--patched", "--max-ulp", "64", "--atol", "3e-7"])
    assert _verdict(check).startswith("PASS (3 sites reached, 5 recorded calls replayed:"), (
        output(check))


@pytest.mark.slow
def test_numpyro_records_and_checks_under_contention(tmp_path):
  """numpyro NUTS (8 chains, one pmap call stepped through its 3,356 loop iterations with a
  host callback each) recorded on 0.6.0, checked per call on 0.10.2, every core busy: a
  verdict (which one is the comparison's business: tests/testing/test_per_call_real_programs)."""
  program = catalog.PROGRAMS["numpyro_nuts"].path
  out = str(tmp_path / "legacy")
  with busy_cores(2400):
    r = _real_cli(catalog.LEGACY_LINE, ["record", program, "--out", out])
    assert r.returncode == 0, output(r)
    assert "1 of those calls hold loops: 3,356 loop iterations stored" in r.stdout, r.stdout
    _verdict(_real_cli(catalog.NEWEST_LINE, ["check", program, "--against", out,
                                             "--per-call"]))
