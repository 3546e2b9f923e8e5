"""Legacy ``jax.pmap`` in this process, on every release that still ships it.

Legacy pmap's runtime (its C++ dispatcher, ``PmapSharding``) is in every release up to
0.9.x and gone from 0.10.0. Through 0.7.x it is ``jax.pmap`` itself; on 0.8–0.9
``jax.pmap`` is shard_map-based unless the ``jax_pmap_shmap_merge`` flag is off
(``JAX_PMAP_SHMAP_MERGE=false``), and the flag is read when a pmap is built, so
``legacy_pmap`` builds one with the flag off and leaves the process's flag alone. On 0.9
setting the flag warns that it is deprecated; that one warning is expected here.
Imports nothing of the project's, so any release's interpreter can use it.
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax
from jax._src import config, lib


def has_legacy_pmap() -> bool:
  """Does this JAX still ship legacy pmap's runtime (its C++ dispatcher)?"""
  return hasattr(lib, "pmap_lib")


@contextlib.contextmanager
def legacy_on() -> Iterator[None]:
  """While inside, ``jax.pmap`` (and ``device_put_replicated`` / ``_sharded``) build legacy
  pmap's kind where this JAX has it: the merge flag off where the release has the flag;
  nothing to do where there is no flag (legacy is the only pmap, or there is none)."""
  flag = getattr(config, "pmap_shmap_merge", None)
  if flag is None:
    yield
    return
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"Setting `jax_pmap_shmap_merge` is deprecated",
                            category=DeprecationWarning)
    with flag(False):
      yield


def legacy_pmap(*args: Any, **kwargs: Any) -> Callable[..., Any]:
  """Legacy ``jax.pmap(*args, **kwargs)`` (only where ``has_legacy_pmap()``)."""
  with legacy_on():
    return jax.pmap(*args, **kwargs)


def legacy_reference() -> Callable[..., Any]:
  """Legacy pmap as a program receives it (only where ``has_legacy_pmap()``): ``jax.pmap``
  itself where that builds legacy's (no flag, or the flag off), so a program can tell it
  apart by identity; else ``legacy_pmap``."""
  flag = getattr(config, "pmap_shmap_merge", None)
  return legacy_pmap if flag is not None and flag.value else jax.pmap


def reference_pmap() -> tuple[str, Callable[..., Any]]:
  """(name, pmap): legacy ``jax.pmap`` where this JAX has it, else its own ``jax.pmap``."""
  if has_legacy_pmap():
    return "legacy jax.pmap", legacy_reference()
  return "jax.pmap", jax.pmap
