"""``.lower()`` / ``.trace()`` in multi-process jobs: host-local arguments, like legacy.

Each process passes its local slice, as for a call. We lower the global program
(abstract global arguments on the global mesh), and the returned ``Lowered`` /
``Compiled`` convert host-local arrays to global ones on the way in and back on
the way out (``multihost``, issue 6), so ``f.lower(x).compile()(x)`` behaves as
legacy's does. Single-process jobs never come here.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
from jax._src import core
from jax.tree_util import tree_flatten, tree_unflatten

from pmap_compat import multihost, program
from pmap_compat.config import PmapConfig


def global_abstract_args(cfg: PmapConfig, fun: Callable, args: tuple, kwargs: dict,
                         meshes_used: dict) -> tuple[tuple, dict, list]:
  """``args``/``kwargs`` with each dynamic leaf replaced by its global ShapeDtypeStruct."""
  call, mesh, shardings = program.input_shardings(cfg, fun, args, kwargs, False, meshes_used)
  size = mesh.shape[mesh.axis_names[0]]
  structs = []
  for x, d, s in zip(call.leaves, call.in_axes, shardings):
    aval = core.get_aval(x)
    shape = list(np.shape(x))
    if d is not None:
      shape[d] = size
    structs.append(jax.ShapeDtypeStruct(tuple(shape), aval.dtype, sharding=s,
                                        weak_type=aval.weak_type))
  dyn, new_kwargs = tree_unflatten(call.in_tree, structs)
  dyn = iter(dyn)
  new_args = tuple(call.static_values[i] if i in call.static_values else next(dyn)
                   for i in range(call.n_args))
  return new_args, new_kwargs, shardings


class _Forward:
  """Forwards everything not overridden to the wrapped JAX stage object."""

  def __init__(self, inner: Any, targets: list):
    self._inner, self._targets = inner, targets

  def __getattr__(self, name: str) -> Any:
    return getattr(self._inner, name)


class LocalCompiled(_Forward):
  """A ``Compiled`` called with host-local arrays (static arguments omitted, as jax's)."""

  def __call__(self, *args, **kwargs):
    leaves, tree = tree_flatten((args, kwargs))
    global_args, global_kwargs = tree_unflatten(
        tree, multihost.local_to_global(leaves, self._targets))
    out = self._inner(*global_args, **global_kwargs)
    out_leaves, out_tree = tree_flatten(out)
    return tree_unflatten(out_tree, multihost.global_to_local(out_leaves))


class LocalLowered(_Forward):
  def compile(self, *args, **kwargs) -> LocalCompiled:
    return LocalCompiled(self._inner.compile(*args, **kwargs), self._targets)


class LocalTraced(_Forward):
  def lower(self, *args, **kwargs) -> LocalLowered:
    return LocalLowered(self._inner.lower(*args, **kwargs), self._targets)


def stage(method: str, jitted: Any, cfg: PmapConfig, fun: Callable, args: tuple,
          kwargs: dict) -> Any:
  """``jitted.lower`` or ``jitted.trace`` on the global program, with local conversion."""
  g_args, g_kwargs, targets = global_abstract_args(cfg, fun, args, kwargs,
                                                   jitted.__wrapped__.meshes_used)
  staged = getattr(jitted, method)(*g_args, **g_kwargs)
  return (LocalLowered if method == "lower" else LocalTraced)(staged, targets)
