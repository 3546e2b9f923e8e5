"""Legacy `jax.pmap`'s results, recorded on jax 0.6.0 so tests can use them on any JAX line.

`support.compare.compare_with_legacy` (and `compare_call`) goes through this module:

  on jax 0.6.0   legacy runs in-process, as always. Its outcome must agree bit for bit
                 with the stored recording of the case (a missing or stale recording
                 fails the test), or, with RECORD_LEGACY=1, is written as the recording.
  elsewhere      (jax 0.10.2, where legacy pmap is gone) the stored recording is the
                 reference: the run under test must match it within
                 `pmap_compat.testing.CROSS_VERSION_MAX_ULP` ulp (XLA moves results by a
                 few last bits between releases; 6e-8 measured on an MNIST MLP), plus any
                 rtol/atol the test gives; ints, bools, keys and strings exactly.

A case is one compare_with_legacy call: the running test's node id (pytest's
PYTEST_CURRENT_TEST) and the call's position within the test. Its recording lives in
`tests/data/legacy/<test module>/<test name>__<n>/` in pmap_compat.testing's format
(manifest.json + one .npy per leaf), with the test's node id, legacy's exception (type
and message) when legacy raised, or why its result could not be stored, in the
manifest's metadata.

Regenerate every recording (jax 0.6.0; deletes the old ones first)::

  make record-legacy

or one test's: RECORD_LEGACY=1 .venv/bin/python -m pytest NODE_ID
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
import re
from pathlib import Path
from typing import Any

import pmap_compat.testing as pt

from support.jax_lines import LEGACY, on_legacy_line, running_jax

DATA_ROOT = Path(__file__).resolve().parent.parent / "data" / "legacy"
# Messages name test files by absolute path; recordings store the checkout's root as this
# placeholder so they hold in any clone.
CHECKOUT = str(DATA_ROOT.parents[2])
CHECKOUT_PLACEHOLDER = "<checkout>"
MODE_VARIABLE = "RECORD_LEGACY"  # "1": write recordings (on jax 0.6.0) instead of checking them

def _regenerate(case: str) -> str:
  test = case.rpartition("__")[0]
  return (f"record it with `RECORD_LEGACY=1 .venv/bin/python -m pytest '{test}'` (jax {LEGACY}; "
          "`make record-legacy` records every test's)")

_MAX_NAME = 120

_calls_per_test: dict[str, int] = {}  # node id -> compare_with_legacy calls made so far


# Exception classes JAX renamed after 0.6.0: the recorded class -> its name on later lines.
# (0.6.0's jax.errors.JaxRuntimeError is an alias of XlaRuntimeError; later it is the class.)
RENAMED = {"jaxlib.xla_extension.XlaRuntimeError": "jax.errors.JaxRuntimeError"}


def _resolve(path: str) -> type[BaseException] | None:
  module, _, qualname = path.rpartition(".")
  try:
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
      found = getattr(found, part)
  except (ImportError, AttributeError):
    return None
  return found if isinstance(found, type) and issubclass(found, BaseException) else None


def _bypassing_init(cls: type[BaseException]) -> Any:
  """Makes an instance whose args are the message, for classes whose __init__ wants more."""
  def build(message: str) -> BaseException:
    error = cls.__new__(cls)
    error.args = (message,)
    return error
  return build


@dataclasses.dataclass(frozen=True)
class RecordedError:
  """The exception legacy raised: its class (module.qualname) and message."""
  type: str
  message: str

  @classmethod
  def of(cls, error: BaseException) -> RecordedError:
    return cls(f"{type(error).__module__}.{type(error).__qualname__}", str(error))

  def _names(self) -> list[str]:
    """The recorded class's path, then its later name if JAX renamed it."""
    return [self.type, *([RENAMED[self.type]] if self.type in RENAMED else [])]

  def matches_type(self, error: BaseException) -> bool:
    """Whether `error` is (a subclass of) the recorded class. Compared by qualified name:
    JAX moves its exception classes between modules from release to release."""
    qualnames = {name.rsplit(".", 1)[-1] for name in self._names()}
    return any(c.__qualname__ in qualnames for c in type(error).__mro__)

  def rebuilt(self) -> BaseException:
    """An instance of the recorded class (or its renamed successor) carrying the recorded
    message, where this JAX has one; else an Exception subclass of the same name."""
    for cls in filter(None, map(_resolve, self._names())):
      for build in (cls, _bypassing_init(cls)):
        try:
          error = build(self.message)
          if str(error) == self.message:
            return error
        except Exception:  # pylint: disable=broad-except  # an odd constructor or __str__
          pass
    return type(self.type.rsplit(".", 1)[-1], (Exception,), {})(self.message)


def _without_addresses(message: str) -> str:
  """Object addresses change from run to run; the rest of a message must not."""
  return re.sub(r"0x[0-9a-fA-F]+", "0x…", message)


def _safe(name: str) -> str:
  safe = re.sub(r"[^A-Za-z0-9_.\-\[\]=]+", "_", name)
  if len(safe) <= _MAX_NAME:
    return safe
  return f"{safe[:_MAX_NAME - 12]}-{hashlib.sha1(name.encode()).hexdigest()[:11]}"


def running_test() -> str | None:
  """The node id of the pytest test running now (None outside a test)."""
  current = os.environ.get("PYTEST_CURRENT_TEST")
  return current.rsplit(" (", 1)[0] if current else None


def next_case(node_id: str) -> str:
  """The case name of the test's next compare_with_legacy call: `<node id>__<n>`."""
  n = _calls_per_test.get(node_id, 0)
  _calls_per_test[node_id] = n + 1
  return f"{node_id}__{n}"


def case_directory(case: str, root: Path = DATA_ROOT) -> Path:
  """tests/data/legacy/<module path under tests/>/<test name and params>__<n>."""
  module, _, test = case.partition("::")
  parts = Path(module).with_suffix("").parts
  parts = parts[1:] if parts and parts[0] == "tests" else parts
  return root.joinpath(*parts, _safe(test.replace("::", ".")))


def writing() -> bool:
  return os.environ.get(MODE_VARIABLE) == "1"


def _unrecordable(value: Any) -> str | None:
  """Why legacy's value cannot be stored as a recording, or None."""
  if callable(value):
    return f"the program returned a {type(value).__name__}, not arrays"
  try:
    pt.recordings.outputs_to_leaves(value)
  except TypeError as e:
    return str(e)
  return None


def write(case: str, value: Any, error: BaseException | None, root: Path = DATA_ROOT) -> Path:
  """Stores legacy's outcome for `case` (on jax 0.6.0)."""
  if not on_legacy_line():
    raise RuntimeError(f"legacy recordings are made with legacy jax.pmap on jax {LEGACY}; "
                       f"this is jax {running_jax()}")
  directory = case_directory(case, root)
  metadata: dict[str, Any] = {"case": case}
  if error is not None:
    recorded = RecordedError.of(error)
    metadata["legacy_error"] = dataclasses.asdict(dataclasses.replace(
        recorded, message=recorded.message.replace(CHECKOUT, CHECKOUT_PLACEHOLDER)))
    value = None
  elif (why := _unrecordable(value)) is not None:
    metadata["unrecordable"] = why
    value = None
  pt.record(value, directory, metadata=metadata)
  return directory


def _read(case: str, root: Path) -> pt.Recording:
  directory = case_directory(case, root)
  try:
    recording = pt.load(directory)
  except FileNotFoundError:
    raise AssertionError(f"no legacy recording for {case} at {directory}; "
                         f"{_regenerate(case)}") from None
  if recording.metadata.get("case") != case:
    raise AssertionError(f"{directory} records {recording.metadata.get('case')!r}, not {case!r} "
                         f"(two cases map to one directory); {_regenerate(case)}")
  return recording


def _recorded_error(recording: pt.Recording) -> RecordedError | None:
  error = recording.metadata.get("legacy_error")
  if not error:
    return None
  recorded = RecordedError(**error)
  return dataclasses.replace(
      recorded, message=recorded.message.replace(CHECKOUT_PLACEHOLDER, CHECKOUT))


def _describe(error: RecordedError | None) -> str:
  return f"raised {error.type}: {error.message}" if error else "returned normally"


def check_fresh(case: str, value: Any, error: BaseException | None,
                root: Path = DATA_ROOT) -> None:
  """On jax 0.6.0: legacy's outcome just computed must be the recorded one, bit for bit."""
  recording = _read(case, root)
  recorded = _recorded_error(recording)
  fresh = RecordedError.of(error) if error is not None else None
  stale = f"the legacy recording for {case} is stale; {_regenerate(case)}"
  if (recorded is None) != (fresh is None):
    raise AssertionError(f"{stale}: recorded legacy {_describe(recorded)}, now it "
                         f"{_describe(fresh)}")
  if recorded is not None and fresh is not None:
    if (recorded.type, _without_addresses(recorded.message)) != (
        fresh.type, _without_addresses(fresh.message)):
      raise AssertionError(f"{stale}: recorded legacy {_describe(recorded)}, now it "
                           f"{_describe(fresh)}")
    return
  why = _unrecordable(value)
  if why != recording.metadata.get("unrecordable"):
    raise AssertionError(f"{stale}: recorded as {recording.metadata.get('unrecordable') or 'values'}"
                         f", now {why or 'values'}")
  if why is None:
    report = pt.check(value, recording.directory)
    if not report.ok:
      raise AssertionError(f"{stale}:\n{report}")


def reference(case: str, value: Any, error: BaseException | None, *, rtol: float | None = None,
              atol: float | None = None, root: Path = DATA_ROOT) -> BaseException | None:
  """Off jax 0.6.0: checks the outcome of the run under test against legacy's recording.

  Raises AssertionError when they disagree; returns legacy's recorded exception
  (rebuilt, see RecordedError.rebuilt) or None when legacy returned normally.
  """
  recording = _read(case, root)
  if "unrecordable" in recording.metadata:
    raise AssertionError(f"legacy's result for {case} could not be recorded "
                         f"({recording.metadata['unrecordable']}), so there is nothing to "
                         f"compare with on jax {running_jax()}: make the program return arrays "
                         "or python scalars, or mark the test jax06_only")
  recorded = _recorded_error(recording)
  if recorded is not None:
    if error is None:
      raise AssertionError(f"legacy jax.pmap (recorded) {_describe(recorded)}; the "
                           f"implementation under test returned {value!r}")
    if not recorded.matches_type(error):
      raise AssertionError(
          f"legacy jax.pmap (recorded) {_describe(recorded)}; the implementation under test "
          f"raised {type(error).__name__}: {error}") from error
    return recorded.rebuilt()
  if error is not None:
    raise AssertionError(f"the implementation under test raised {type(error).__name__}: "
                         f"{error}; legacy jax.pmap (recorded) returned normally") from error
  if callable(value):
    raise AssertionError(f"the implementation under test returned a {type(value).__name__}; "
                         "legacy jax.pmap (recorded) returned arrays")
  given = rtol is not None or atol is not None
  report = pt.check(value, recording.directory, rtol=rtol, atol=atol,
                    max_ulp=pt.CROSS_VERSION_MAX_ULP if given else None)
  if not report.ok:
    raise AssertionError(f"values differ from legacy jax.pmap's recorded result:\n{report}")
  return None
