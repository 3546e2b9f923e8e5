"""The executable cache: one ``jax.jit`` object per (function, pmap parameters).

Keyed weakly on the function, so every ``pmap(f, ...)`` wrapper of the same ``f`` with
the same parameters shares one jit (and so one trace/compile cache), as legacy pmap's
C++ cache does. jit itself keys on tree structure, avals, shardings and static args.
The staged program holds ``f`` weakly, so dropping the last wrapper frees the entry.
"""
from __future__ import annotations

import weakref
from typing import Any, NamedTuple
from collections.abc import Callable

import jax
from jax.sharding import Mesh

from pmap_compat import program
from pmap_compat.config import PmapConfig


class Program(NamedTuple):
  """One staged program: its jit, and the meshes its traces chose (mapped size -> Mesh),
  which the slow path reads to place inputs where the compiled program expects them."""
  jitted: Any
  meshes: dict[int, Mesh]


class Entry:
  """The programs for one (function, config): top-level calls and calls under a trace.

  ``holders`` are (weak) references to the functions of the live wrappers: equal but
  distinct callables (e.g. two ``obj.method`` bound methods) share an entry, and any
  live one of them can be traced.
  """

  __slots__ = ("cfg", "holders", "info", "top", "_spread", "__weakref__")

  def __init__(self, holder: Callable[[], Callable | None], cfg: PmapConfig,
               info: program.FunInfo):
    self.cfg, self.holders, self.info = cfg, [holder], info
    self.top = self._make(spread=False)
    self._spread: Program | None = None

  def fun_ref(self) -> Callable:
    for holder in self.holders:
      fun = holder()
      if fun is not None:
        return fun
    raise RuntimeError("pmap_compat: the mapped function was garbage collected")

  def add_holder(self, fun: Callable) -> None:
    self.holders = [h for h in self.holders if h() is not None]
    if not any(h() is fun for h in self.holders):
      self.holders.append(weakref.ref(fun))

  def _make(self, spread: bool) -> Program:
    meshes: dict[int, Mesh] = {}
    staged = program.make_staged(self.fun_ref, self.cfg, spread, self.info, meshes)
    # No argnames: jit would infer them from the user's signature, but pmap's static and
    # donated arguments are positional only.
    jitted = jax.jit(staged, static_argnums=self.cfg.static, static_argnames=(),
                     donate_argnums=self.cfg.donate, donate_argnames=(), keep_unused=True)
    return Program(jitted, meshes)

  def program(self, spread: bool) -> Program:
    """``spread``: the variant used inside a user's jit, where k-device maps may span all
    devices."""
    if not spread:
      return self.top
    if self._spread is None:
      self._spread = self._make(spread=True)
    return self._spread


_BY_FUN: weakref.WeakKeyDictionary[Any, dict] = weakref.WeakKeyDictionary()


def entry_for(fun: Callable, cfg: PmapConfig) -> Entry:
  key = cfg.key()
  try:
    per_fun = _BY_FUN.get(fun)
    if per_fun is None:
      per_fun = _BY_FUN[fun] = {}
    ref = weakref.ref(fun)
  except TypeError:  # unhashable or not weak-referenceable: a private, unshared entry
    return Entry(lambda: fun, cfg, program.fun_info(fun, cfg))
  entry = per_fun.get(key)
  if entry is None:
    entry = per_fun[key] = Entry(ref, cfg, program.fun_info(fun, cfg))
  else:
    entry.add_holder(fun)
  return entry
