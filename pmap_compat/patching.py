"""Opt-in switch that makes ``jax.pmap`` resolve to ``pmap_compat.pmap``.

For third-party code (e.g. Flax's ``jax_utils``) that calls ``jax.pmap`` itself. While
patched, the ``pmap`` attribute of the ``jax`` module is ours, and the two placement
functions pmap code pairs with it, ``jax.device_put_replicated`` and
``jax.device_put_sharded``, exist: jax 0.10.0 dropped them from the ``jax`` namespace
but kept their implementations (``jax._src.api``), which place values exactly as the
pmap of that JAX expects them. Where ``jax`` still has them they are left alone.
``unpatch()`` restores every attribute as it was; nothing else in JAX is touched.
``from jax import pmap`` executed while patched binds ours; names bound before keep
legacy's.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax
from jax._src import api as jax_api

# Removed from the jax namespace in 0.10.0; restored while patched where they are missing.
_PLACEMENT = ("device_put_replicated", "device_put_sharded")

_lock = threading.Lock()
_depth = 0
_original: Callable[..., Any] | None = None
_added: list[str] = []  # placement functions patch() put into the jax namespace


def patch() -> None:
  """Rebind ``jax.pmap`` to ours. Nests: each ``patch()`` needs one ``unpatch()``."""
  global _depth, _original
  from pmap_compat.api import pmap  # noqa: PLC0415
  with _lock:
    if _depth == 0:
      _original = jax.pmap
      jax.pmap = pmap
      for name in _PLACEMENT:
        if name not in vars(jax):
          setattr(jax, name, getattr(jax_api, name))
          _added.append(name)
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
      for name in _added:
        delattr(jax, name)
      _added.clear()


@contextlib.contextmanager
def patched() -> Iterator[None]:
  """``with pmap_compat.patched(): ...`` runs the block with ``jax.pmap`` being ours."""
  patch()
  try:
    yield
  finally:
    unpatch()
