"""Equivalence machinery shared by tests/equivalence/ and `make demo`.

Runs each shipped example (examples/*.py, `run(**kwargs) -> pytree`) in a fresh
subprocess in one of these modes:

  legacy                the example as written, on legacy `jax.pmap` (jax 0.6.0)
  pmap_compat           the same code with `pmap_compat.patched()` active while the
                        module is imported and run (module-level decorators included)
  codemod-experimental  the codemod's output for `--target experimental`
  codemod-jax           the codemod's output for `--target jax`; jax 0.6.0 has no
                        `jax.shard_map`, so the child provides one as a thin keyword
                        adapter over `jax.experimental.shard_map.shard_map`
  jax0.10.2-pmap        the example as written on jax 0.10.2, whose `jax.pmap` is
                        JAX's own shard_map-based one (legacy pmap is gone there)
  jax0.10.2-codemod-jax the codemod's `--target jax` output on jax 0.10.2
  jax0.10.2-pmap_compat the example as written on jax 0.10.2, under `pmap_compat.patched()`
                        (legacy semantics where 0.10.2's own pmap breaks, e.g. nested pmaps)

Every child stores what `run` returned with `pmap_compat.testing.record` (a
version-independent recording), and every comparison is
`pmap_compat.testing.compare_recordings`: bit for bit between runs on the same JAX
(the first four modes against legacy; the codemod output and pmap_compat on 0.10.2
against 0.10.2's own pmap where that runs the example), and within the documented
cross-version bound (`CROSS_VERSION_MAX_ULP`) between jax 0.10.2 and legacy on 0.6.0.

`Runner.per_call(case, mode)` checks call by call instead: the example recorded under
legacy `jax.pmap` with `record --calls`, then `check --per-call` in a jax 0.10.2 mode
(`PER_CALL_MODES`): every recorded call of every pmap site on its recorded inputs, within
`PER_CALL_MAX_ULP`, with the recorded outputs handed back (`pmap_compat.testing.per_call`).

A fresh process per run keeps module-level pmap objects, caches and patching
from leaking between modes. Multi-process cases start several children as one
`jax.distributed` job over 127.0.0.1 and compare process by process. Results
are cached in a work directory (safe to share between pytest-xdist workers),
so legacy runs once per example however many modes are compared against it.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import time
import traceback
from typing import Any
from collections.abc import Iterator, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools")
EXAMPLES = os.path.join(ROOT, "examples")
TESTS = os.path.join(ROOT, "tests")

NEWEST_JAX = "0.10.2"  # the newest JAX line, in .venv-jax0.10.2 (see the Makefile)
NEWEST_PMAP = f"jax{NEWEST_JAX}-pmap"
NEWEST_CODEMOD = f"jax{NEWEST_JAX}-codemod-jax"
NEWEST_PATCHED = f"jax{NEWEST_JAX}-pmap_compat"
MODES = ("legacy", "pmap_compat", "codemod-experimental", "codemod-jax", NEWEST_PMAP,
         NEWEST_CODEMOD, NEWEST_PATCHED)
LEGACY_LINE = MODES[1:4]  # run on jax 0.6.0 next to legacy and compared with it bit for bit
NEWEST_LINE = (NEWEST_CODEMOD, NEWEST_PATCHED)  # checked by Runner.newest_line
# A mode is a way of running ("pmap": the example as written, "pmap_compat": under
# patched(), "codemod-<target>": the codemod's output), on jax 0.6.0 (this python; as
# written is "legacy") or, prefixed "jax<release>-", in that release's environment: the
# modes above, and the same on any release the project builds (tools/release_matrix.py).
_KINDS = ("pmap", "pmap_compat", "codemod-experimental", "codemod-jax")


def mode_parts(mode: str) -> tuple[str | None, str]:
  """(the JAX release a mode runs on, None for this python's; how it runs, of _KINDS)."""
  release, sep, kind = mode.partition("-") if mode.startswith("jax") else ("", "", mode)
  kind = "pmap" if kind == "legacy" else kind
  if kind not in _KINDS or (sep and not release[3:]):
    raise ValueError(f"mode: expected one of {_KINDS}, optionally prefixed 'jax<release>-', "
                     f"or 'legacy'; got {mode!r}")
  return (release[3:] or None), kind


def codemod_target(mode: str) -> str | None:
  """The codemod --target whose output the mode runs, or None for code as written."""
  kind = mode_parts(mode)[1]
  return kind.removeprefix("codemod-") if kind.startswith("codemod-") else None


def is_patched(mode: str) -> bool:
  """Does the mode run the example under pmap_compat.patched()?"""
  return mode_parts(mode)[1] == "pmap_compat"
CHILD_TIMEOUT_S = 240.0


@dataclasses.dataclass(frozen=True)
class Case:
  """One example run: which file, with which arguments, on how many processes."""
  name: str
  module: str  # file name under examples/, without .py
  kwargs: dict = dataclasses.field(default_factory=dict)
  processes: int = 1  # >1: a jax.distributed job over 127.0.0.1, 8 // processes devices each
  rtol: float | None = None  # only where reduction order legitimately differs (see `why`)
  atol: float | None = None
  why: str = "bit-for-bit"
  # The codemod's output may differ from legacy within this relative bound (and only it):
  # a per-device program laid out differently can be compiled differently by XLA.
  codemod_rtol: float | None = None
  codemod_why: str = ""
  codemod_flags: tuple[str, ...] = ()
  slow: bool = False
  source: str | None = None  # a program outside examples/ (the CLI below); overrides `module`

  @property
  def path(self) -> str:
    return self.source or os.path.join(EXAMPLES, self.module + ".py")


# Every case is compared bit for bit: the step functions run the same per-device
# computation and the same XLA all-reduce / all-gather / collective-permute in every
# mode, so there is no reduction whose order may legitimately change. The one exception,
# codemod output only, names its mechanism (codemod_why).
CASES: tuple[Case, ...] = (
    Case("dp_sgd", "dp_sgd", {"steps": 4}),
    Case("dropout_prng", "dropout_prng"),
    Case("broadcast_params", "broadcast_params"),
    Case("replicated_metrics", "replicated_metrics"),
    Case("nested_data_model", "nested_data_model", codemod_rtol=2.5e-7, codemod_why=(
        "up to 2 ulp in w on some CPUs: legacy's nested program slices each device's w out "
        "of the replicated block inside the update's fusion, the rewrite reads its block "
        "directly, and XLA:CPU contracts w - lr * g into an FMA for every element of the "
        "one but only some of the other (seen on AVX2 hosts; identical on others)")),
    Case("ring_allreduce", "ring_allreduce"),
    Case("gather_scatter", "gather_scatter"),
    Case("static_config", "static_config"),
    Case("replicate_loop", "replicate_loop"),
    Case("multiprocess_sgd", "multiprocess_sgd"),
    # Converted with no flag: every converted site is correct with several processes.
    Case("multiprocess_sgd_2proc", "multiprocess_sgd", processes=2),
)
CASES_BY_NAME = {c.name: c for c in CASES}


# --------------------------------------------------------------------------- results


@dataclasses.dataclass
class RunResult:
  """What one (case, mode) run produced: a pmap_compat.testing recording per process."""
  case: str
  mode: str
  directory: str | None = None  # the recording (DIR/process_<i> for a multi-process case)
  processes: int = 1
  seconds: float = 0.0  # wall time of run(), slowest process
  error: str | None = None  # a one-line summary when the run failed
  detail: str = ""  # traceback / stderr

  @property
  def ok(self) -> bool:
    return self.error is None

  def recording_dirs(self) -> list[str]:
    if self.processes == 1:
      return [self.directory]
    return [os.path.join(self.directory, f"process_{i}") for i in range(self.processes)]

  def recordings(self) -> list:
    """The recordings (pmap_compat.testing.Recording), one per process."""
    from pmap_compat.testing import recordings  # pylint: disable=import-outside-toplevel
    return [recordings.read(d) for d in self.recording_dirs()]


@dataclasses.dataclass
class Comparison:
  """One mode's verdict against another (legacy, unless `against` says otherwise)."""
  case: str
  mode: str
  identical: bool  # every leaf bit for bit
  message: str
  seconds: float
  ok: bool = False  # within the tolerance (bit for bit on one JAX; the cross-version bound)
  against: str = "legacy"
  report: str = ""  # pmap_compat.testing's full report(s)
  worst_ulp: float = 0.0  # the largest difference, in ulp at leaf scale, when not identical


# --------------------------------------------------------------------------- child side


def keyword_shard_map(f=None, /, *, out_specs, in_specs, mesh=None, axis_names=frozenset(),
                      check_vma: bool = True):
  """`jax.shard_map` (jax >= 0.6.1) spelled on jax 0.6.0's experimental shard_map."""
  import functools
  from jax.experimental.shard_map import shard_map
  if f is None:
    return functools.partial(keyword_shard_map, out_specs=out_specs, in_specs=in_specs,
                             mesh=mesh, axis_names=axis_names, check_vma=check_vma)
  if mesh is None:
    raise TypeError("this jax.shard_map adapter needs an explicit mesh= (jax 0.6.0 has no "
                    "context-mesh shard_map)")
  auto = frozenset(mesh.axis_names) - frozenset(axis_names) if axis_names else frozenset()
  return shard_map(f, mesh, in_specs, out_specs, check_rep=check_vma, auto=auto)


def _load_module(path: str):
  import importlib.util
  name = "example_" + os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


def _status_path(out_dir: str, process: int) -> str:
  return f"{out_dir}.status.p{process}.json"


def child_main(argv: Sequence[str]) -> int:
  """Runs one example in this (fresh) process and records what `run` returned."""
  mode, source, out_dir, kwargs = argv[0], argv[1], argv[2], json.loads(argv[3])
  process = int(os.environ.get("PMAP_EXAMPLE_PROCESS_ID", "0"))
  status: dict[str, Any] = {}
  try:
    import jax
    if codemod_target(mode) == "jax" and not hasattr(jax, "shard_map"):
      jax.shard_map = keyword_shard_map  # adds a name jax 0.6.0 lacks; replaces nothing
    with contextlib.ExitStack() as stack:
      if is_patched(mode):
        import pmap_compat
        stack.enter_context(pmap_compat.patched())
      sys.path.insert(0, os.path.dirname(source))
      # Which pmap the example's `jax.pmap` resolves to (checked by the parent for pmap_compat).
      status["pmap"] = getattr(getattr(jax, "pmap", None), "__module__", "?")
      module = _load_module(source)
      start = time.perf_counter()
      out = jax.block_until_ready(module.run(**kwargs))
      status["seconds"] = time.perf_counter() - start
    from pmap_compat import testing
    testing.record(out, out_dir, metadata={"mode": mode, "source": source, "kwargs": kwargs})
  except BaseException as e:  # pylint: disable=broad-except
    status = {"error": f"{type(e).__name__}: {e}".splitlines()[0][:300],
              "detail": traceback.format_exc()}
  path = _status_path(out_dir, process)
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(status, f)
  os.replace(path + ".tmp", path)
  jax = sys.modules.get("jax")
  if jax is not None and getattr(jax.distributed, "is_initialized", lambda: False)():
    jax.distributed.shutdown()  # else gloo processes can hang at exit
  return 0


# --------------------------------------------------------------------------- parent side


def _child_env(devices: int) -> dict[str, str]:
  env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PMAP_EXAMPLE_"))}
  env["JAX_PLATFORMS"] = "cpu"
  env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
  return env


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def python_for(mode: str) -> str:
  """The interpreter a mode runs on: this one (jax 0.6.0), or the `.venv-jax<version>` one."""
  version = mode_parts(mode)[0]
  if version is None:
    return sys.executable
  if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
  from support.venvs import python_for as venv_python  # pylint: disable=import-outside-toplevel
  return venv_python(version)


def _child_command(mode: str, case: Case) -> list[str]:
  # The shipped examples follow JAX's test policy (a DeprecationWarning is an error);
  # a user's own program (the CLI) may still call deprecated APIs.
  policy = ["-W", "error::DeprecationWarning"] if case.source is None else []
  return [python_for(mode), *policy, "-c",
          f"import sys; sys.path.insert(0, {TOOLS!r}); import equivalence; "
          "sys.exit(equivalence.child_main(sys.argv[1:]))"]


def _collect(result: RunResult, procs: list, logs: list, timed_out: bool) -> RunResult:
  """Reads each child's status file (and its log when it left none)."""
  seconds, pmaps = [], set()
  for i, (p, log) in enumerate(zip(procs, logs, strict=True)):
    log.seek(0)
    text = log.read().decode(errors="replace")
    log.close()
    path = _status_path(result.directory, i)
    if not os.path.exists(path):
      reason = "timed out" if timed_out else f"exited with status {p.returncode}"
      return dataclasses.replace(result, error=f"child process {reason} without a result",
                                 detail=text[-4000:])
    with open(path, encoding="utf-8") as f:
      got = json.load(f)
    if "error" in got:
      return dataclasses.replace(result, error=got["error"], detail=got["detail"] + text[-2000:])
    pmaps.add(got["pmap"])
    seconds.append(got["seconds"])
  if is_patched(result.mode) and not all(p.startswith("pmap_compat") for p in pmaps):
    return dataclasses.replace(result, error=f"jax.pmap resolved to {sorted(pmaps)} under "
                               "pmap_compat.patched(), not to pmap_compat's")
  return dataclasses.replace(result, seconds=max(seconds))


def run_source(case: Case, mode: str, source: str, scratch: str) -> RunResult:
  """Runs `source`'s `run(**case.kwargs)` in fresh process(es) in `mode`."""
  os.makedirs(scratch, exist_ok=True)
  env = _child_env(8 // case.processes)
  if case.processes > 1:
    env.update(PMAP_EXAMPLE_COORDINATOR=f"127.0.0.1:{_free_port()}",
               PMAP_EXAMPLE_NUM_PROCESSES=str(case.processes))
  out_dir = os.path.join(scratch, f"{case.name}.{mode}")
  if os.path.exists(out_dir):
    shutil.rmtree(out_dir)
  logs = [open(f"{out_dir}.p{i}.log", "w+b")  # pylint: disable=consider-using-with
          for i in range(case.processes)]
  procs = []
  for i, log in enumerate(logs):
    if os.path.exists(_status_path(out_dir, i)):
      os.remove(_status_path(out_dir, i))
    child_env = dict(env, PMAP_EXAMPLE_PROCESS_ID=str(i)) if case.processes > 1 else env
    procs.append(subprocess.Popen(
        _child_command(mode, case) + [mode, source, out_dir, json.dumps(case.kwargs)],
        env=child_env, cwd=scratch, stdout=log, stderr=subprocess.STDOUT))
  deadline = time.monotonic() + CHILD_TIMEOUT_S
  timed_out = False
  for p in procs:
    try:
      p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      timed_out = True
  for p in procs:
    if p.poll() is None:
      p.kill()
      p.wait()
  return _collect(RunResult(case.name, mode, out_dir, case.processes), procs, logs, timed_out)


def compare(case: Case, expected: RunResult, other: RunResult) -> Comparison:
  """`pmap_compat.testing.compare_recordings`, process by process: bit for bit when both
  ran on one JAX, else within the cross-version bound (or the case's own rtol/atol)."""
  from pmap_compat import testing  # pylint: disable=import-outside-toplevel
  verdict = functools.partial(Comparison, case.name, other.mode, seconds=other.seconds,
                              against=expected.mode)
  if not expected.ok:
    return verdict(False, f"{expected.mode} failed: {expected.error}")
  if not other.ok:
    return verdict(False, other.error)
  rtol = case.rtol
  # The case's codemod bound is about 0.6.0's compiler (this python's codemod modes).
  if other.mode in ("codemod-experimental", "codemod-jax") and case.codemod_rtol is not None:
    rtol = case.codemod_rtol
  reports = [testing.compare_recordings(e, o, rtol=rtol, atol=case.atol)
             for e, o in zip(expected.recording_dirs(), other.recording_dirs(), strict=True)]
  text = "\n\n".join(str(r) for r in reports)
  identical = all(not r.structure and all(l.status == "identical" for l in r.leaves)
                  for r in reports)
  for i, report in enumerate(reports):
    if not report.ok:
      first = (report.structure[:1] or [report.failures[0].line()])[0]
      where = f"process {i}: " if len(reports) > 1 else ""
      return verdict(False, where + " ".join(first.split()), report=text)
  if identical:
    return verdict(True, case.why, ok=True, report=text)
  worst = max((r.worst for r in reports if r.worst), key=lambda l: l.scale_ulp or 0.0)
  return verdict(False, f"within {reports[0].tolerance.describe()}; worst leaf "
                 f"{worst.path}: {worst.difference()}", ok=True, report=text,
                 worst_ulp=worst.scale_ulp or 0.0)


# --------------------------------------------------------------------------- codemod


@dataclasses.dataclass
class CodemodTree:
  """A rewritten copy of examples/ for one target."""
  target: str
  directory: str
  report: str  # the report text of every codemod invocation, concatenated
  returncodes: list[int]
  error: str | None = None


def codemod_command(paths: Sequence[str], *extra: str) -> list[str]:
  return [sys.executable, "-m", "codemod.pmap_to_shmap", *paths, *extra]


def example_sources() -> dict[str, tuple[str, ...]]:
  """Every examples/*.py with the codemod flags its cases need."""
  sources = {os.path.join(EXAMPLES, f): () for f in sorted(os.listdir(EXAMPLES))
             if f.endswith(".py")}
  for case in CASES:
    sources[case.path] = case.codemod_flags
  return sources


def rewrite_files(sources: dict[str, tuple[str, ...]], target: str, dest: str) -> CodemodTree:
  """Copies `sources` into `dest` and runs the codemod CLI on the copies in place."""
  if os.path.exists(dest):
    shutil.rmtree(dest)
  os.makedirs(dest)
  groups: dict[tuple[str, ...], list[str]] = {}  # files needing other flags: own invocation
  for path, flags in sources.items():
    copy = os.path.join(dest, os.path.basename(path))
    shutil.copyfile(path, copy)
    groups.setdefault(flags, []).append(copy)
  report, rcs = [], []
  for flags, paths in groups.items():
    report_file = os.path.join(dest, f".report{len(rcs)}.txt")
    cmd = codemod_command(paths, "--target", target, "--in-place", "--report", report_file, *flags)
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_child_env(8),
                          timeout=300, check=False)
    rcs.append(proc.returncode)
    text = open(report_file).read() if os.path.exists(report_file) else ""
    report.append(text or proc.stdout)
    # 0/1 are the CLI's "nothing/something to report"; a traceback is a crash whatever the code.
    if proc.returncode not in (0, 1) or "Traceback (most recent call last)" in proc.stderr:
      tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
      return CodemodTree(target, dest, "".join(report), rcs,
                         error=f"codemod exited {proc.returncode}: {tail}")
  return CodemodTree(target, dest, "".join(report), rcs)


OWN_PACKAGES = ("pmap_compat", "shard_map_impl", "codemod")


def remaining_pmap_uses(path: str) -> list[str]:
  """`file:line` for every `pmap` name or attribute still in the (rewritten) file,
  and for every import of this project's packages (the rewrite must not need them)."""
  tree = ast.parse(open(path, encoding="utf-8").read())
  found = []
  for node in ast.walk(tree):
    modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
               [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
    if any(m.split(".")[0] in OWN_PACKAGES for m in modules):
      found.append(f"{os.path.basename(path)}:{node.lineno} (imports {modules[0]})")
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(
        node, ast.Attribute) else node.name if isinstance(node, ast.alias) else None
    if name == "pmap" or (isinstance(node, ast.alias) and name.endswith(".pmap")):
      found.append(f"{os.path.basename(path)}:{node.lineno}")
  return found


def uses_target_api(path: str, target: str) -> bool:
  """Whether the rewritten file calls the shard_map its --target promises."""
  tree = ast.parse(open(path, encoding="utf-8").read())
  for node in ast.walk(tree):
    if target == "jax" and isinstance(node, ast.Attribute) and node.attr == "shard_map" and (
        isinstance(node.value, ast.Name) and node.value.id == "jax"):
      return True
    if target == "experimental" and isinstance(node, ast.ImportFrom) and (
        node.module == "jax.experimental.shard_map"):
      return True
  return False


# --------------------------------------------------------------------------- orchestration


@contextlib.contextmanager
def _lock(path: str, timeout: float = 900.0) -> Iterator[None]:
  """An exclusive lock between processes (pytest-xdist workers) via O_EXCL creation."""
  deadline = time.monotonic() + timeout
  while True:
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
      break
    except FileExistsError:
      if time.monotonic() > deadline:
        raise TimeoutError(f"waited {timeout:.0f}s for {path}") from None
      time.sleep(0.2)
  try:
    yield
  finally:
    os.close(fd)
    os.remove(path)


class Runner:
  """Computes and caches run results under one work directory."""

  def __init__(self, workdir: str, sources: dict[str, tuple[str, ...]] | None = None):
    self.workdir = workdir
    self.sources = example_sources() if sources is None else sources
    os.makedirs(workdir, exist_ok=True)

  def _cached(self, key: str, compute):
    path = os.path.join(self.workdir, key + ".pkl")
    with _lock(path + ".lock"):
      if os.path.exists(path):
        with open(path, "rb") as f:
          return pickle.load(f)
      value = compute()
      with open(path + ".tmp", "wb") as f:
        pickle.dump(value, f)
      os.replace(path + ".tmp", path)
      return value

  def codemod_tree(self, target: str) -> CodemodTree:
    return self._cached(f"codemod-{target}", lambda: rewrite_files(
        self.sources, target, os.path.join(self.workdir, f"rewritten-{target}")))

  def source_for(self, case: Case, mode: str) -> tuple[str | None, str | None]:
    """The file to run for `mode`, or an error saying why there is none."""
    target = codemod_target(mode)
    if target is None:
      return case.path, None
    tree = self.codemod_tree(target)
    if tree.error:
      return None, tree.error
    path = os.path.join(tree.directory, os.path.basename(case.path))
    left = remaining_pmap_uses(path)
    if left:
      return None, ("codemod left pmap in place (not converted) or added a dependency on this "
                    f"project at {', '.join(left)}")
    if not uses_target_api(path, target):
      return None, f"the rewrite of {os.path.basename(path)} does not use the {mode} shard_map API"
    return path, None

  def result(self, case: Case, mode: str) -> RunResult:
    def compute():
      source, error = self.source_for(case, mode)
      if error:
        return RunResult(case.name, mode, error=error)
      return run_source(case, mode, source, os.path.join(self.workdir, "runs"))
    return self._cached(f"run-{case.name}-{mode}", compute)

  def compare(self, case: Case, mode: str, against: str = "legacy") -> Comparison:
    return compare(case, self.result(case, against), self.result(case, mode))

  def per_call(self, case: Case, mode: str) -> PerCallResult:
    """The case recorded per call under legacy pmap, checked per call in `mode`."""
    if mode not in PER_CALL_MODES:
      raise ValueError(f"mode: expected one of {PER_CALL_MODES}, got {mode!r}")
    recording, detail = self._cached(f"per-call-record-{case.name}",
                                     lambda: per_call_recording(case, self.workdir))
    if recording is None:
      return PerCallResult(case.name, mode, False, error=f"legacy recording failed: {detail}")
    source, error = self.source_for(case, mode)
    if error:
      return PerCallResult(case.name, mode, False, error=error)
    return self._cached(f"per-call-{case.name}-{mode}", lambda: per_call_check(
        case, mode, source, recording, self.workdir))

  def newest_line(self, case: Case, mode: str = NEWEST_CODEMOD) -> list[Comparison]:
    """A mode of the jax 0.10.2 line (the codemod output, or the example under
    pmap_compat.patched()): bit for bit against 0.10.2's own pmap where that runs the
    example, and within the cross-version bound against legacy on 0.6.0."""
    if mode not in NEWEST_LINE:
      raise ValueError(f"mode: expected one of {NEWEST_LINE}, got {mode!r}")
    verdicts = []
    if self.result(case, NEWEST_PMAP).ok:
      verdicts.append(self.compare(case, mode, against=NEWEST_PMAP))
    return verdicts + [self.compare(case, mode)]


# --------------------------------------------------------------------------- per call


PER_CALL_MODES = (NEWEST_PMAP, NEWEST_PATCHED, NEWEST_CODEMOD)  # checked against legacy
PER_CALL_K = 10  # calls stored per site: every call of most examples


@dataclasses.dataclass
class PerCallResult:
  """`check --per-call` of one (case, mode) against the legacy per-call recording."""
  case: str
  mode: str
  ok: bool
  error: str | None = None
  outputs: list[str] = dataclasses.field(default_factory=list)  # each process's report
  largest: str = ""  # the report's "largest difference of a replayed call" line

  @property
  def summary(self) -> str:
    if self.error:
      return self.error
    return self.outputs[0].rstrip().splitlines()[-1] if self.outputs else "(no output)"


def _cli_jobs(case: Case, python: str, args: list[str], scratch: str, label: str,
              ) -> list[tuple[int, str]]:
  """`python -m pmap_compat.testing ARGS` as the case runs (N processes for a job)."""
  os.makedirs(scratch, exist_ok=True)
  env = _child_env(8 // case.processes)
  env["PYTHONPATH"] = ROOT  # the program's own directory comes first (load_program)
  if case.processes > 1:
    env.update(PMAP_EXAMPLE_COORDINATOR=f"127.0.0.1:{_free_port()}",
               PMAP_EXAMPLE_NUM_PROCESSES=str(case.processes))
  procs, logs = [], []
  for i in range(case.processes):
    log = open(os.path.join(scratch, f"{label}.p{i}.log"), "w+")  # noqa: SIM115
    child_env = dict(env, PMAP_EXAMPLE_PROCESS_ID=str(i)) if case.processes > 1 else env
    procs.append(subprocess.Popen([python, "-m", "pmap_compat.testing", *args], env=child_env,
                                  cwd=scratch, stdout=log, stderr=subprocess.STDOUT))
    logs.append(log)
  deadline = time.monotonic() + CHILD_TIMEOUT_S
  results = []
  for p, log in zip(procs, logs, strict=True):
    try:
      p.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      p.kill()
      p.wait()
    log.seek(0)
    results.append((p.returncode, log.read()))
    log.close()
  return results


def per_call_recording(case: Case, workdir: str) -> tuple[str | None, str]:
  """The case recorded under legacy jax.pmap with PER_CALL_K calls per site (this python)."""
  out = os.path.join(workdir, "per-call", f"{case.name}.legacy")
  jobs = _cli_jobs(case, sys.executable, ["record", case.path, "--out", out, "--calls",
                                          str(PER_CALL_K), "--kwargs", json.dumps(case.kwargs)],
                   os.path.join(workdir, "per-call"), f"{case.name}.record")
  failed = [text for rc, text in jobs if rc != 0]
  return (None, failed[0][-3000:]) if failed else (out, jobs[0][1])


def per_call_check(case: Case, mode: str, source: str, recording: str,
                   workdir: str) -> PerCallResult:
  """`check --per-call` of `source` in `mode` against the legacy per-call recording."""
  args = ["check", source, "--against", recording, "--per-call", "--kwargs",
          json.dumps(case.kwargs)] + (["--patched"] if is_patched(mode) else [])
  jobs = _cli_jobs(case, python_for(mode), args, os.path.join(workdir, "per-call"),
                   f"{case.name}.{mode}")
  outputs = [text for _, text in jobs]
  largest = next((l for l in outputs[0].splitlines()
                  if "largest difference of a replayed call" in l), "")
  if any(rc not in (0, 1) for rc, _ in jobs):
    last = (outputs[0].strip().splitlines() or ["no output"])[-1]
    return PerCallResult(case.name, mode, False, error=f"check did not compare: {last}",
                         outputs=outputs)
  return PerCallResult(case.name, mode, all(rc == 0 for rc, _ in jobs), outputs=outputs,
                       largest=largest)


# --------------------------------------------------------------------------- CLI


def _verdict_line(v: Comparison) -> str:
  word = "identical" if v.identical else "within tolerance" if v.ok else "DIFFERS"
  return f"{v.mode} vs {v.against}: {word} ({v.message})"


def main(argv: Sequence[str] | None = None) -> int:
  """`python tools/equivalence.py PROGRAM.py`: the same check for a program of your own."""
  import argparse
  import tempfile
  parser = argparse.ArgumentParser(
      prog="equivalence", description="Run PROGRAM's run(**kwargs) on legacy jax.pmap, under "
      "pmap_compat.patched() and as the codemod rewrites it, on jax 0.6.0 and on jax "
      f"{NEWEST_JAX}, and compare every output with legacy's (pmap_compat.testing).")
  parser.add_argument("program", help="a .py file defining run(**kwargs) -> pytree")
  parser.add_argument("--kwargs", default="{}", help="JSON keyword arguments for run()")
  parser.add_argument("--processes", type=int, default=1,
                      help="run as a jax.distributed job of N local processes")
  parser.add_argument("--modes", default=",".join(MODES[1:]),
                      help=f"comma-separated, from {', '.join(MODES[1:])}")
  parser.add_argument("--per-call", action="store_true",
                      help=f"also check call by call on jax {NEWEST_JAX} (check --per-call "
                      "against a per-call legacy recording) in the modes of that line")
  args = parser.parse_args(argv)
  modes = args.modes.split(",")
  unknown = [m for m in modes if m not in MODES[1:]]
  if unknown:
    parser.error(f"--modes: unknown {unknown}; choose from {', '.join(MODES[1:])}")
  source = os.path.abspath(args.program)
  flags: tuple[str, ...] = ()
  case = Case(os.path.splitext(os.path.basename(source))[0], "", json.loads(args.kwargs),
              processes=args.processes, codemod_flags=flags, source=source)
  failed = 0
  with tempfile.TemporaryDirectory(prefix="equivalence-") as tmp:
    runner = Runner(tmp, sources={source: flags})
    legacy = runner.result(case, "legacy")
    print(f"legacy: {f'ran in {legacy.seconds:.2f}s' if legacy.ok else legacy.error}")
    for mode in modes:
      if mode == NEWEST_PMAP and not runner.result(case, mode).ok:
        # Information, not a failure: the codemod output is what runs on the newest JAX.
        print(f"{mode}: failed to run ({runner.result(case, mode).error})")
        continue
      verdicts = runner.newest_line(case, mode) if mode in NEWEST_LINE else [
          runner.compare(case, mode)]
      for verdict in verdicts:
        failed += not verdict.ok
        print(_verdict_line(verdict))
    for mode in PER_CALL_MODES if args.per_call else ():
      result = runner.per_call(case, mode)
      failed += not result.ok and not (mode == NEWEST_PMAP and result.error)
      print(f"{mode} per call: {result.summary}" + (f"; {result.largest}" if result.largest
                                                      else ""))
  return 1 if failed or not legacy.ok else 0


if __name__ == "__main__":
  # Run as the importable module, so the classes in pickled results are one class.
  sys.path.insert(0, TOOLS)
  import equivalence  # pylint: disable=import-self
  sys.exit(equivalence.main())
