"""The command line's guard against XLA ending a run without a verdict on a loaded machine.

On the CPU backend a process's devices are threads (8 of them with the usual
``--xla_force_host_platform_device_count=8``, and a pool of as many for their programs'
parallel work), and a collective (``psum``, ``pmean``, ...) waits in a rendezvous until
every device thread has reached it. When one is late past a limit, XLA ends the process (a
C++ ``LOG(FATAL)``: "Termination timeout for `all reduce ...` of 40 seconds exceeded",
a stack trace, SIGABRT). Which jaxlibs have such a limit, and which let XLA_FLAGS set it
(``--xla_cpu_collective_call_terminate_timeout_seconds``, counted after the warning that
``..._warn_stuck_timeout_seconds`` times), is asked of XLA (`xla_knows`), not of a
version.

Nothing the tool does makes a device late: a pmap site without loops runs as the program
calls it, the per-call replay blocks on each call so one collective program is in flight,
and the loop steps' host callbacks (loop_steps) take small pieces and return. What leaves a
device thread a minute behind is the machine: far more runnable threads than cores (8
device threads, their pool, other processes, a process of lower priority than theirs),
which makes a run slow, not stuck. So the command line raises the limit where XLA lets it
(`CollectiveTimeout`, ``--collective-timeout``, default `DEFAULT_TIMEOUT_S`), before JAX
starts its backend, and again after importing the program when the program replaced
``XLA_FLAGS`` (programs often set the device count there). A limit still reached (a real
deadlock, a jaxlib without the flag, a program that starts JAX with its own flags at import)
must still give a verdict: `supervise` runs the command in a child process (forked on
Linux, a new interpreter elsewhere) whose stderr it passes on, and when the child dies from a signal it says why (`diagnose`: the collective,
how long it waited, how many devices had arrived) and what to do, and exits with the
command line's "nothing compared" status.

Where XLA has no limit (jax 0.6's jaxlib), or the wait is not in a collective (a host
callback waiting for something that never comes), a stuck run would wait forever. A
stuck process does not run: `supervise` also ends the child when it and the processes it
started used almost no CPU time (`Progress`: under 1% of one core) for twice that limit
(past XLA's own, so XLA's message, which names the collective, comes first where it has
one), and says so (`stalled`). A slow run on a loaded machine still gets its share of the
cores, so this never ends one.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import mmap
import os
import re
import select
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence

TERMINATE_FLAG = "xla_cpu_collective_call_terminate_timeout_seconds"
# Ten minutes: no fairly scheduled thread falls that far behind; a real deadlock still
# ends, with the message below, rather than waiting forever.
DEFAULT_TIMEOUT_S = 600
NOT_COMPARED = 2  # the command line's status when nothing was compared (__main__)

# Whether XLA knows a flag cannot be asked in-process: it aborts the process on an unknown
# one in XLA_FLAGS. A fresh interpreter parses XLA_FLAGS holding just that flag (building
# compile options reads them, without starting a backend; where that entry point is gone,
# starting the CPU backend does).
_PROBE = """
try:
  from jaxlib import xla_client
  xla_client.CompileOptions()
except (ImportError, AttributeError):
  import jax
  jax.devices("cpu")
"""


def _absent_from_jaxlib(flag: str) -> bool:
  """True when no shared library of this interpreter's jaxlib holds the flag's name, which
  XLA's flag table would: the answer without starting an interpreter (on a jaxlib without
  the flag, that one ends in XLA's abort and its stack trace)."""
  spec = importlib.util.find_spec("jaxlib")
  locations = list(spec.submodule_search_locations or []) if spec is not None else []
  libraries = [os.path.join(d, name) for d in locations for name in os.listdir(d)
               if name.endswith(".so")]
  if not libraries:
    return False  # nothing to look at: ask XLA
  for library in libraries:
    try:
      with open(library, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m.find(flag.encode()) >= 0:
          return False
    except (OSError, ValueError):
      return False
  return True


def xla_knows(flag: str, python: str | None = None) -> bool:
  """Whether the XLA of `python`'s jaxlib (default: this interpreter's) accepts `--flag`
  in XLA_FLAGS."""
  if python is None and _absent_from_jaxlib(flag):
    return False
  env = dict(os.environ, XLA_FLAGS=f"--{flag}=1", JAX_PLATFORMS="cpu")
  try:
    probe = subprocess.run([python or sys.executable, "-c", _PROBE], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=300, check=False)
  except (OSError, subprocess.TimeoutExpired):
    return False
  return probe.returncode == 0


def flag_value(xla_flags: str, flag: str) -> str | None:
  """The value `xla_flags` gives `--flag` (the last one, as XLA reads them), if any."""
  value = None
  for token in xla_flags.split():
    if token.startswith(f"--{flag}="):
      value = token.split("=", 1)[1]
  return value


def with_flag(xla_flags: str, flag: str, value: int) -> str:
  """`xla_flags` with `--flag=value` added, unless it sets the flag itself already."""
  if flag_value(xla_flags, flag) is not None:
    return xla_flags
  return f"{xla_flags} --{flag}={value}".strip()


@dataclasses.dataclass
class CollectiveTimeout:
  """The limit the command line asks for a CPU collective, and how it is set."""
  seconds: int
  flag: str | None  # the XLA flag that sets it; None where this jaxlib has none
  given: str | None = None  # the user's own value in XLA_FLAGS, which is kept
  replaced_by_program: bool = False  # the program set XLA_FLAGS without it

  @classmethod
  def for_this_jax(cls, seconds: int) -> CollectiveTimeout:
    flags = os.environ.get("XLA_FLAGS", "")
    given = flag_value(flags, TERMINATE_FLAG)
    if given is not None:  # the user chose; it is known to this XLA, or it aborts anyway
      return cls(seconds, TERMINATE_FLAG, given)
    return cls(seconds, TERMINATE_FLAG if xla_knows(TERMINATE_FLAG) else None)

  def apply(self) -> None:
    """Puts the flag into XLA_FLAGS, before JAX starts its backend (which reads them), and
    says so to interpreters started from this one (`calibrate` runs the program in one)."""
    if self.flag is not None:
      os.environ["XLA_FLAGS"] = with_flag(os.environ.get("XLA_FLAGS", ""), self.flag,
                                          self.seconds)
      os.environ[_ENV] = f"{self.flag}={self.seconds}"

  def program_imported(self) -> None:
    """After the program's import: it may have replaced XLA_FLAGS (its device count, say)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if self.flag is not None and flag_value(flags, self.flag) is None:
      self.replaced_by_program = True
      self.apply()

  @property
  def in_effect(self) -> str:
    if self.given is not None:
      return f"{self.given} s, as your XLA_FLAGS set it"
    if self.flag is None:
      return "XLA's own"
    return f"{self.seconds} s"


_active: CollectiveTimeout | None = None  # set while the command line supervises a run
_ENV = "PMAP_COMPAT_TESTING_COLLECTIVE_TIMEOUT"  # FLAG=SECONDS, for interpreters it starts


def program_imported() -> None:
  """Called once the program is imported (programs.load_program); a no-op outside the
  command line and the interpreters it starts."""
  global _active  # pylint: disable=global-statement
  if _active is None and "=" in os.environ.get(_ENV, ""):
    flag, seconds = os.environ[_ENV].split("=", 1)
    if seconds.isdigit():
      _active = CollectiveTimeout(int(seconds), flag)
  if _active is not None:
    _active.program_imported()


@contextlib.contextmanager
def _no_fork_warning() -> Iterator[None]:
  # Python 3.12+ warns (DeprecationWarning) about forking a process with threads; this
  # one has only numpy's BLAS threads, which handle fork, and no JAX backend yet.
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r".*multi-threaded.*fork", category=DeprecationWarning)
    yield


def _die_with_parent(parent: int) -> None:
  """The child ends when the supervising process does (killed by a test's timeout, say)."""
  try:
    import ctypes  # pylint: disable=import-outside-toplevel
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass
  if os.getppid() != parent:  # it died before prctl
    os.kill(os.getpid(), signal.SIGKILL)


# Set in the environment of a child that `supervise` starts as a new interpreter: that
# one runs the command itself.
RESPAWNED = "PMAP_COMPAT_TESTING_SUPERVISED"


def supervise(run: Callable[[], int], timeout: CollectiveTimeout, command: str,
              respawn: Sequence[str], fork: bool | None = None) -> int:
  """The command in a child process, with `timeout` applied; its status, or when a
  signal ends it, NOT_COMPARED and a message saying why (see the module docstring).
  The child is `run()` in a fork of this process where forking is safe (Linux; `fork`
  overrides), else a new interpreter running `respawn`, the same command line, with
  `RESPAWNED` set."""
  global _active  # pylint: disable=global-statement
  timeout.apply()
  _active = timeout
  if fork is None:
    fork = sys.platform.startswith("linux") and hasattr(os, "fork")
  sys.stdout.flush()
  sys.stderr.flush()
  spawned: subprocess.Popen | None = None
  if fork:
    read_end, write_end = os.pipe()
    parent = os.getpid()
    with _no_fork_warning():
      child = os.fork()
    if child == 0:
      os.close(read_end)
      _die_with_parent(parent)
      os.dup2(write_end, 2)
      os.close(write_end)
      return run()
    os.close(write_end)
  else:
    spawned = subprocess.Popen(list(respawn), stderr=subprocess.PIPE,
                               env=dict(os.environ, **{RESPAWNED: "1"}))
    assert spawned.stderr is not None
    child, read_end = spawned.pid, os.dup(spawned.stderr.fileno())
    spawned.stderr.close()
  forwarded: list[int] = []

  def forward(signum: int, _frame: object) -> None:
    forwarded.append(signum)
    with contextlib.suppress(ProcessLookupError):
      os.kill(child, signum)

  handlers = {s: signal.signal(s, forward)
              for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None}
  # Ctrl-C reaches the child too (same process group); the child decides.
  handlers[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
  seen: list[str] = []
  progress = Progress(child, 2 * timeout.seconds)
  ended_stuck = False
  try:
    pending = b""
    while True:
      if _readable(read_end):
        chunk = os.read(read_end, 1 << 16)  # as it comes: progress bars end in \r
        if not chunk:
          break
        _write_all(chunk)
        *lines, pending = (pending + chunk).split(b"\n")
        pending = pending[-(1 << 16):]
        for line in lines:
          _keep(line.decode("utf-8", "replace"), seen)
      if not ended_stuck and progress.stuck():
        ended_stuck = True
        end_tree(child)
    _keep(pending.decode("utf-8", "replace"), seen)
    # Negative: ended by that signal (a waitpid status in Popen's convention).
    code = (spawned.wait() if spawned is not None
            else os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
  finally:
    os.close(read_end)
    for s, handler in handlers.items():
      signal.signal(s, handler)
  if code >= 0:
    return code
  signum = -code
  if signum in forwarded:  # stopped from outside: end as asked
    os.kill(os.getpid(), signum)
  message = (stalled(progress, timeout, command) if ended_stuck
             else diagnose(signum, seen, timeout, command))
  sys.stderr.write(message + "\n")
  sys.stderr.flush()
  return NOT_COMPARED


def _readable(fd: int) -> bool:
  """Whether `fd` has data, or its end, within a poll; always where a pipe cannot be
  polled (Windows: the read then waits, and a stuck run is not watched)."""
  try:
    return bool(select.select([fd], [], [], _POLL_S)[0])
  except (OSError, ValueError):
    return True


_POLL_S = 5.0  # how often the supervisor looks at the child's CPU time
_IDLE_SHARE = 0.01  # of one core: less than this over the limit is a stuck run


class Progress:
  """Whether a process tree still runs: the CPU time it used (Linux /proc), sampled as the
  supervisor polls; stuck when it used under `_IDLE_SHARE` of one core over `seconds`."""

  def __init__(self, root: int, seconds: float):
    self.root, self.seconds = root, seconds
    self.samples: list[tuple[float, float]] = []  # (monotonic time, CPU seconds)

  def stuck(self) -> bool:
    now = time.monotonic()
    if self.samples and now - self.samples[-1][0] < _POLL_S:
      return False
    used = cpu_seconds(self.root)
    if used is None:  # gone, or no /proc: nothing to judge
      return False
    self.samples.append((now, used))
    old = [sample for sample in self.samples if now - sample[0] >= self.seconds]
    if not old:
      return False
    self.samples = self.samples[len(old) - 1:]  # the latest sample a window back, and after
    start_time, start_used = old[-1]
    return used - start_used < _IDLE_SHARE * (now - start_time)

  @property
  def idle_for(self) -> float:
    return self.samples[-1][0] - self.samples[0][0] if self.samples else 0.0


def cpu_seconds(root: int) -> float | None:
  """CPU time used so far by process `root` and the processes under it, from /proc; None
  where `root` is not there."""
  tree = _process_tree(root)
  if tree is None:
    return None
  return sum(tree.values()) / os.sysconf("SC_CLK_TCK")


def end_tree(root: int) -> None:
  """Kills `root` and the processes under it (a calibrating interpreter, say)."""
  for pid in sorted(_process_tree(root) or {root: 0}, key=lambda p: p != root):
    with contextlib.suppress(ProcessLookupError, PermissionError):
      os.kill(pid, signal.SIGKILL)


def _process_tree(root: int) -> dict[int, int] | None:
  """The processes under `root` (itself included), each with the CPU clock ticks it and
  its waited-for children used; None where `root` is not in /proc."""
  parent_of: dict[int, int] = {}
  ticks: dict[int, int] = {}
  try:
    entries = [e for e in os.listdir("/proc") if e.isdigit()]
  except OSError:
    return None
  for entry in entries:
    try:
      with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
      continue  # ended meanwhile
    # after the command's name: state, ppid, ..., utime, stime, cutime, cstime (14-17)
    parent_of[int(entry)] = int(fields[1])
    ticks[int(entry)] = sum(int(x) for x in fields[11:15])
  if root not in ticks:
    return None
  tree = {}
  for pid, used in ticks.items():
    up, hops = pid, 0
    while up != root and up in parent_of and hops < 64:
      up, hops = parent_of[up], hops + 1
    if up == root:
      tree[pid] = used
  return tree


def stalled(progress: Progress, timeout: CollectiveTimeout, command: str) -> str:
  """What to tell the user when the supervisor ended a run that stopped running."""
  return "\n".join([
      f"error: the run was stuck: for {progress.idle_for:.0f} s it used almost no CPU time "
      "(its devices waiting for each other in a collective, or the program waiting for "
      "something that did not come), so it was ended. That says nothing about the "
      f"results: nothing was {command}ed.",
      "hint: a program that waits that long on purpose needs a longer limit: "
      f"--collective-timeout SECONDS (this run: {timeout.seconds} s)"])


def _write_all(data: bytes) -> None:
  """`data` to this process's stderr (where it cannot be written, it is dropped)."""
  with contextlib.suppress(OSError):
    while data:
      data = data[os.write(2, data):]


def _keep(line: str, seen: list[str]) -> None:
  """Keeps the lines of the child's stderr that `diagnose` reads: XLA's fatal lines, its
  first warning that a collective may be stuck, and the termination."""
  if _FATAL.match(line) or "Termination timeout for" in line or (
      _STUCK.search(line) and not any(_STUCK.search(kept) for kept in seen)):
    seen.append(line)
    del seen[:-20]


# A fatal line of XLA's log: "F1206 02:17:47.85 ...] text" (absl), or
# "2026-12-06 02:18:06.68: F external/...] text" (older jaxlibs).
_FATAL = re.compile(r"F\d{4} |\d{4}-\d\d-\d\d [\d:.]+: F ")
# XLA warns once a collective has waited `warn` seconds, then waits the termination limit
# more before it aborts.
_STUCK = re.compile(r"has been waiting for `[^`]*` for (?P<seconds>\d+) seconds and may be stuck")
_TERMINATION = re.compile(
    r"Termination timeout for `(?P<what>[^`]*)` of (?P<seconds>\d+) seconds exceeded"
    r".*?(?:Expected (?P<expected>\d+) threads.*?only (?P<arrived>\d+) of them arrived"
    r"|All (?P<joined>\d+) threads joined)")


def diagnose(signum: int, fatal_lines: list[str], timeout: CollectiveTimeout,
             command: str) -> str:
  """What to tell the user when the command's process died from `signum`, given the
  fatal and rendezvous lines XLA wrote to stderr before."""
  try:
    name = signal.Signals(signum).name
  except ValueError:
    name = f"signal {signum}"
  nothing = f"nothing was {command}ed"
  match = next((m for m in map(_TERMINATION.search, fatal_lines) if m is not None), None)
  if match is None:
    last = next((line for line in reversed(fatal_lines) if _FATAL.match(line)), None)
    cause = f": {last.split('] ', 1)[-1]}" if last else ""
    return f"error: the run died from {name}{cause}\n{nothing}"
  operation = match["what"].split(" RendezvousKey")[0]
  seconds = int(match["seconds"])
  stuck = next((m for m in map(_STUCK.search, fatal_lines) if m is not None), None)
  total = seconds + (int(stuck["seconds"]) if stuck is not None else 0)
  if match["joined"] is not None:
    waited = (f"all {match['joined']} devices reached it, but it did not complete within "
              f"{total} s")
  else:
    waited = (f"it waited {total} s for its last device ({match['arrived']} of "
              f"{match['expected']} devices had arrived)")
  lines = [f"error: XLA ended the run: a collective of the program ({operation}) on the "
           f"CPU backend: {waited}, the limit at which XLA aborts the process (its "
           f"termination timeout, {seconds} s, after its warning that the collective may "
           "be stuck).",
           "On the CPU backend each device is a thread; with more device threads than "
           "cores and other processes busy, one can fall that far behind. That says "
           f"nothing about the results: {nothing}."]
  if timeout.flag is None:
    hint = ("this jaxlib has no flag to lengthen that limit (XLA_FLAGS "
            f"--{TERMINATE_FLAG} is unknown to it): run it again on a less loaded machine "
            "or with fewer devices (--xla_force_host_platform_device_count), or on a "
            "jaxlib that has the flag")
  elif timeout.given is None and seconds != timeout.seconds:
    hint = (f"the limit asked for ({timeout.seconds} s, --collective-timeout) was not in "
            "effect" + (": the program sets XLA_FLAGS itself, and JAX started with its "
                        f"flags; add --{TERMINATE_FLAG}={timeout.seconds} to them"
                        if timeout.replaced_by_program else
                        f"; set XLA_FLAGS=--{TERMINATE_FLAG}={timeout.seconds}"))
  else:
    hint = ("run it again on a less loaded machine, or give collectives longer with "
            f"--collective-timeout SECONDS (this run: {timeout.in_effect}); a run that "
            "stops at a long limit too is stuck: the devices wait for each other")
  lines.append(f"hint: {hint}")
  return "\n".join(lines)
