"""Writing files safely: through a temporary file in the same directory and a rename, so
an interrupted run never leaves a half-written file."""
from __future__ import annotations

import os
import stat
import tempfile


def write_atomically(path: str, data: bytes) -> None:
  """Replaces (or creates) ``path`` with ``data``, keeping an existing file's mode."""
  directory = os.path.dirname(os.path.abspath(path))
  mode = stat.S_IMODE(os.stat(path).st_mode) if os.path.exists(path) else None
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".pmap-to-shmap-", suffix=".tmp")
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
