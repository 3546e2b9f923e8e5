"""The files a run touches: which ones it reads (discovery, symlinks), how it writes them
(a temporary file in the same directory and a rename, so an interrupted run never leaves
a half-written file), and the temporary files an interrupted run left behind.

Symlinks are not followed out of the given paths unless asked: a link whose target lies
outside them is reported and left alone. A followed link is written through (its target
is replaced, never the link), and a file reached by several paths is read once.
"""
from __future__ import annotations

import errno
import os
import re
import socket
import stat
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from codemod.findings import Finding, Severity

SOURCE_SUFFIXES = (".py", ".ipynb", ".md")
_SKIP_DIRS = frozenset({"__pycache__", "node_modules", "site-packages", "venv", "build",
                        "dist"})

# Temporary files carry the writing host and process, so a later run can tell a stale one
# (that process is gone) from one a running process is still writing. They end in .tmp,
# never in a source suffix, so discovery never reads one as a source.
_TEMP_PREFIX = ".pmap-to-shmap-"
_TEMP_RE = re.compile(r"\.pmap-to-shmap-(?P<host>[A-Za-z0-9._-]+)-(?P<pid>\d+)-[a-z0-9_]+\.tmp")
_OLD_TEMP_RE = re.compile(r"\.pmap-to-shmap-[a-z0-9_]{8}\.tmp")  # written before the pid


def _host() -> str:
  return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())[:64] or "host"


def write_atomically(path: str, data: bytes) -> None:
  """Replaces (or creates) ``path`` with ``data``, keeping an existing file's mode.

  A symlink is written through: its target is replaced and the link stays. A file the
  caller may not write is refused (``PermissionError``) rather than replaced by the rename.
  """
  path = os.path.realpath(path)
  directory = os.path.dirname(path)
  exists = os.path.exists(path)
  if exists and not os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids):
    raise PermissionError(errno.EACCES, "read-only file", path)
  mode = stat.S_IMODE(os.stat(path).st_mode) if exists else None
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=f"{_TEMP_PREFIX}{_host()}-{os.getpid()}-",
                             suffix=".tmp")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, mode if mode is not None else 0o644)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


@dataclass(frozen=True)
class Notice:
  """Something about a path that is not a finding inside a source file."""
  path: str
  finding: Finding
  failed: bool = False  # the path could not be read, listed, written or removed


@dataclass
class Discovery:
  sources: list[str] = field(default_factory=list)  # in walk order, each real file once
  notices: list[Notice] = field(default_factory=list)
  directories: list[str] = field(default_factory=list)  # walked, for stale temp files


def _notice(path: str, severity: Severity, message: str, failed: bool = False) -> Notice:
  return Notice(path, Finding(1, 1, severity, message), failed)


class _Roots:
  """The given paths' real locations: what counts as inside them."""

  def __init__(self, paths: Sequence[str]) -> None:
    self.dirs = [os.path.realpath(p) for p in paths if os.path.isdir(p)]
    self.files = {os.path.realpath(p) for p in paths
                  if not os.path.isdir(p) and not os.path.islink(p)}

  def contain(self, real: str) -> bool:
    return real in self.files or any(real == d or real.startswith(d.rstrip(os.sep) + os.sep)
                                     for d in self.dirs)


def discover(paths: Sequence[str], follow_symlinks: bool = False) -> Discovery:
  """The .py, .ipynb and .md files under ``paths`` (files named directly are always
  considered), each real file once, a path that is not a symlink preferred."""
  roots = _Roots(paths)
  found = Discovery()
  candidates: list[str] = []
  for path in paths:
    if os.path.isdir(path):
      candidates.extend(_walk(path, roots, follow_symlinks, found))
    else:
      candidates.append(path)
      found.directories.append(os.path.dirname(path) or os.curdir)
  chosen: dict[str, str] = {}  # real path -> the path it is read through
  for path in candidates:
    real = os.path.realpath(path)
    if os.path.islink(path):
      if not os.path.exists(real):
        found.notices.append(_notice(path, Severity.WARNING,
                                     f"broken symlink (to {os.readlink(path)}), skipped"))
        continue
      if not roots.contain(real) and not follow_symlinks:
        found.notices.append(_notice(
            path, Severity.WARNING, f"symlink to {real}, outside the given paths: left alone "
            "(--follow-symlinks converts the file it points to)"))
        continue
    if not os.path.isfile(real):  # reading a FIFO or device would block or never end
      found.notices.append(_notice(path, Severity.WARNING, "not a regular file, skipped"))
      continue
    if real not in chosen or (os.path.islink(chosen[real]) and not os.path.islink(path)):
      chosen[real] = path
  found.sources = [p for p in dict.fromkeys(candidates) if chosen.get(os.path.realpath(p)) == p]
  return found


def _walk(top: str, roots: _Roots, follow_symlinks: bool, found: Discovery) -> Iterator[str]:
  visited: set[str] = set()

  def unlistable(error: OSError) -> None:
    found.notices.append(_notice(error.filename or top, Severity.ERROR,
                                 f"cannot list the directory, skipped: {error.strerror}",
                                 failed=True))

  for root, dirs, names in os.walk(top, onerror=unlistable, followlinks=follow_symlinks):
    visited.add(os.path.realpath(root))
    found.directories.append(root)
    kept = []
    for d in sorted(dirs):
      path = os.path.join(root, d)
      if d.startswith(".") or d in _SKIP_DIRS:
        continue
      if os.path.islink(path):
        real = os.path.realpath(path)
        if roots.contain(real) or real in visited:
          continue  # its files are reached without it
        if not follow_symlinks:
          found.notices.append(_notice(
              path, Severity.WARNING, f"symlink to the directory {real}, outside the given "
              "paths: not walked (--follow-symlinks walks it)"))
          continue
        visited.add(real)
      kept.append(d)
    dirs[:] = kept
    for name in sorted(names):
      if name.endswith(SOURCE_SUFFIXES):
        yield os.path.join(root, name)


def _alive(pid: int) -> bool:
  if pid == os.getpid():
    return True
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # another user's process
  return True


def temp_files(directories: Sequence[str], remove: bool) -> list[Notice]:
  """Notices for the temporary files runs of the codemod left in ``directories``; with
  ``remove``, the stale ones (their process is gone) are deleted."""
  notices = []
  for directory in dict.fromkeys(directories):
    try:
      names = sorted(os.listdir(directory))
    except OSError:
      continue  # an unlistable directory is reported by discovery
    for name in names:
      path = os.path.join(directory, name)
      if not name.startswith(_TEMP_PREFIX) or not os.path.isfile(path) or os.path.islink(path):
        continue
      match = _TEMP_RE.fullmatch(name)
      if match is None:
        if _OLD_TEMP_RE.fullmatch(name):
          notices.append(_notice(path, Severity.WARNING, "temporary file of an earlier "
                                 "pmap-to-shmap run; remove it once no run is in progress"))
        continue
      host, pid = match.group("host"), int(match.group("pid"))
      if host != _host() or _alive(pid):
        notices.append(_notice(path, Severity.INFO, f"temporary file of a pmap-to-shmap "
                               f"run on {host} (pid {pid}) that may still be running: left alone"))
        continue
      notices.append(_stale(path, pid, remove))
  return notices


def _stale(path: str, pid: int, remove: bool) -> Notice:
  what = f"temporary file left by an interrupted pmap-to-shmap run (pid {pid})"
  if not remove:
    return _notice(path, Severity.INFO, f"{what}; --in-place removes it")
  try:
    os.unlink(path)
  except OSError as e:
    return _notice(path, Severity.ERROR, f"cannot remove the {what}: {e.strerror}", failed=True)
  return _notice(path, Severity.INFO, f"removed the {what}")
