"""Opt-in switch that makes ``jax.pmap`` resolve to ``pmap_compat.pmap``.

For third-party code (e.g. Flax's ``jax_utils``) that calls ``jax.pmap`` itself. Only
the ``pmap`` attribute of the ``jax`` module is rebound, only while patched, and the
original is restored by ``unpatch()``; nothing else in JAX is touched. ``from jax import
pmap`` executed while patched binds ours; names bound before keep legacy's.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax

_lock = threading.Lock()
_depth = 0
_original: Callable[..., Any] | None = None


def patch() -> None:
  """Rebind ``jax.pmap`` to ours. Nests: each ``patch()`` needs one ``unpatch()``."""
  global _depth, _original
  from pmap_compat.api import pmap  # noqa: PLC0415
  with _lock:
    if _depth == 0:
      _original = jax.pmap
      jax.pmap = pmap
    _depth += 1


def unpatch() -> None:
  """Undo one ``patch()``; the last one restores legacy ``jax.pmap``."""
  global _depth, _original
  with _lock:
    if _depth == 0:
      raise RuntimeError("pmap_compat.unpatch() called without a matching patch()")
    _depth -= 1
    if _depth == 0:
      assert _original is not None  # set by the patch() this undoes
      jax.pmap = _original
      _original = None


@contextlib.contextmanager
def patched() -> Iterator[None]:
  """``with pmap_compat.patched(): ...`` runs the block with ``jax.pmap`` being ours."""
  patch()
  try:
    yield
  finally:
    unpatch()
