"""Opt-in switch that makes ``jax.pmap`` resolve to ``pmap_compat.pmap``.

For third-party code (e.g. Flax's ``jax_utils``, numpyro's MCMC) that calls ``jax.pmap``
itself. While patched:

- the ``pmap`` attribute of the ``jax`` module is ours;
- so is every other name already bound to JAX's ``pmap`` function object itself (found by
  identity, not by name) in the modules imported before ``patch()``: a module's globals
  (``from jax import pmap``, ``p = jax.pmap``) and the attributes of the classes it defines
  (plain or as a ``staticmethod``). JAX's own modules are left alone;
- ``jax.device_put_replicated`` / ``jax.device_put_sharded``, which pmap code pairs with
  ``pmap``, exist: jax 0.10.0 dropped them from the ``jax`` namespace but kept their
  implementations (``jax._src.api``), which place values exactly as the pmap of that JAX
  expects them. ``device_put_sharded`` also takes shards that span several devices, as
  ``y[0]`` of that JAX's pmap outputs does (``placement``). Where ``jax`` still has them
  they are left alone.

References that ``patch()`` cannot rebind without reaching into other code's objects, a
default argument, a closure variable, a ``functools.partial`` holding JAX's ``pmap``, are
named in an ``UnpatchedPmapWarning`` where they can be found cheaply (module-level
functions and partials, and the functions of module-level classes); calls through them
keep JAX's ``pmap``. References held by instances or containers are not searched.

A function that JAX's ``jax.pmap`` already built before ``patch()`` and a module keeps in
its globals (``cross_replica_mean = jax.pmap(...)``, a module-level ``@jax.pmap``) is
rebuilt with ``pmap_compat.pmap`` from the function and arguments JAX's pmap kept
(``jax_line.prebuilt_pmap``), and every global holding it is rebound to that; where this
JAX keeps them out of reach the global is named in the warning. One held elsewhere (an
instance, a container, a class) stays JAX's: build it inside the block.

``unpatch()`` restores each binding it changed, unless the code changed it meanwhile.
Names bound while patched (``from jax import pmap`` executed inside the block) keep
``pmap_compat.pmap`` after the block: they cannot be told from a deliberate
``from pmap_compat import pmap``. Nothing else in JAX is touched.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax

from pmap_compat import jax_line, placement

# Removed from the jax namespace in 0.10.0; restored while patched where they are missing.
_PLACEMENT = ("device_put_replicated", "device_put_sharded")


class UnpatchedPmapWarning(UserWarning):
  """``pmap_compat.patch()`` found references to JAX's ``pmap`` that it cannot rebind."""


class _Binding(NamedTuple):
  """One name ``patch()`` rebound: ``owner.name`` was ``before``, is now ``after``."""
  owner: Any  # a module or a class
  name: str
  before: Any
  after: Any


_lock = threading.Lock()
_depth = 0
_original: Callable[..., Any] | None = None
_added: list[str] = []  # placement functions patch() put into the jax namespace
_rebound: list[_Binding] = []  # names outside jax that patch() pointed at ours


def _skipped(module_name: str | None) -> bool:
  """JAX's own modules (which use their pmap on purpose) and ours."""
  return (module_name or "").split(".", 1)[0] in ("jax", "jaxlib", "pmap_compat")


def _module_dicts() -> dict[int, tuple[str, types.ModuleType]]:
  """id of each imported module's namespace dict -> (module name, module)."""
  found = {}
  for name, module in list(sys.modules.items()):
    namespace = getattr(module, "__dict__", None)
    if isinstance(module, types.ModuleType) and isinstance(namespace, dict):
      found[id(namespace)] = (name, module)
  return found


def _where(fun: Any) -> str:
  return f"{getattr(fun, '__module__', '?')}.{getattr(fun, '__qualname__', '?')}"


def _search(original: Any) -> tuple[list[_Binding], list[str]]:
  """The names bound to ``original`` in imported modules and in the classes they define,
  and a description of each other reference to it found (default arguments, closures,
  ``functools.partial`` objects, instance attributes), which rebinding cannot reach.

  Asks the garbage collector for what refers to ``original`` (one pass over the tracked
  objects, and at most two more, only when references other than module globals exist)
  rather than walking every module's namespace in Python: a few objects refer to JAX's
  pmap, hundreds of thousands are in the namespaces of a large program's modules. Classes
  are found through their namespace dicts (attributes, and staticmethods one step
  further), functions through their defaults and closure tuples.
  """
  modules = _module_dicts()
  bindings: list[_Binding] = []
  unreachable: list[str] = []
  held: list[Any] = []  # what refers to ``original`` other than a module's globals
  for ref in gc.get_referrers(original):
    if isinstance(ref, types.FrameType) or ref is _rebound:
      continue  # a running function's local variable: gone once it returns
    owner = modules.get(id(ref))
    if owner is None:
      held.append(ref)
    elif not _skipped(owner[0]):
      bindings += [_Binding(owner[1], k, v, None) for k, v in list(ref.items()) if v is original]
  if not held:
    return bindings, unreachable
  held_ids = {id(h) for h in held}
  classes: list[type] = []
  # Held one step further away: closure tuples (cells) and class dicts (staticmethods).
  further: list[Any] = []
  for ref in gc.get_referrers(*held):
    if isinstance(ref, type):
      classes.append(ref)
    elif isinstance(ref, dict) and id(ref) not in modules and any(
        isinstance(v, staticmethod) and id(v) in held_ids for v in list(ref.values())):
      further.append(ref)
    elif isinstance(ref, types.FunctionType):
      if not _skipped(ref.__module__) and (
          id(ref.__defaults__) in held_ids or id(ref.__kwdefaults__) in held_ids):
        unreachable.append(f"{_where(ref)} (a default argument)")
    elif isinstance(ref, tuple) and any(isinstance(c, types.CellType) and id(c) in held_ids
                                        for c in ref):
      further.append(ref)
    elif id(ref) in modules:
      name = modules[id(ref)][0]
      if not _skipped(name):
        unreachable += [f"{name}.{k} (a functools.partial)" for k, v in list(ref.items())
                        if isinstance(v, functools.partial) and id(v) in held_ids]
  for ref in held:
    kind = type(ref)
    if not (isinstance(ref, (dict, tuple, list, types.CellType, functools.partial,
                             staticmethod, classmethod)) or _skipped(kind.__module__)):
      unreachable.append(f"an attribute of a {kind.__module__}.{kind.__qualname__} instance")
  if further:
    further_ids = {id(f) for f in further}
    for ref in gc.get_referrers(*further):
      if isinstance(ref, type):
        classes.append(ref)
      elif (isinstance(ref, types.FunctionType) and id(ref.__closure__) in further_ids
            and not _skipped(ref.__module__)):
        names = [n for n, c in zip(ref.__code__.co_freevars, ref.__closure__ or (), strict=True)
                 if id(c) in held_ids]
        unreachable.append(f"{_where(ref)} (closure variable {', '.join(map(repr, names))})")
  for cls in {id(c): c for c in classes}.values():
    if not _skipped(cls.__module__):
      bindings += [_Binding(cls, k, v, None) for k, v in list(vars(cls).items())
                   if v is original or (isinstance(v, staticmethod) and v.__func__ is original)]
  return bindings, unreachable


def _prebuilt(ours: Callable[..., Any]) -> tuple[list[_Binding], list[str]]:
  """Module globals holding a function that JAX's pmap built before ``patch()`` (a
  module-level ``f = jax.pmap(g, ...)`` or ``@jax.pmap``), each paired with ``ours`` built
  from the same function and arguments (one per function JAX built, however many names
  hold it); those whose arguments this JAX keeps out of reach are described instead."""
  bindings: list[_Binding] = []
  unreachable: list[str] = []
  rebuilt: dict[int, Any] = {}
  for module_name, module in list(sys.modules.items()):
    namespace = getattr(module, "__dict__", None)
    if (_skipped(module_name) or not isinstance(module, types.ModuleType)
        or not isinstance(namespace, dict)):
      continue
    for name, value in list(namespace.items()):
      # Cheap filter first: what JAX's pmap returns is one of these two types.
      if type(value) is not types.FunctionType and type(value).__name__ != "PmapFunction":
        continue
      if id(value) not in rebuilt:
        try:
          parts = jax_line.prebuilt_pmap(value)
        except LookupError:
          unreachable.append(f"{module_name}.{name} (built by jax.pmap before patch())")
          continue
        if parts is None:
          continue
        rebuilt[id(value)] = ours(parts[0], **parts[1])
      bindings.append(_Binding(module, name, value, rebuilt[id(value)]))
  return bindings, unreachable


def _rebind(bindings: list[_Binding], ours: Any) -> list[_Binding]:
  done = []
  for b in bindings:
    after = staticmethod(ours) if isinstance(b.before, staticmethod) else ours
    setattr(b.owner, b.name, after)
    done.append(b._replace(after=after))
  return done


def _restore(bindings: list[_Binding]) -> None:
  for b in bindings:
    if vars(b.owner).get(b.name, None) is b.after:  # not rebound by the code meanwhile
      setattr(b.owner, b.name, b.before)


def patch() -> None:
  """Rebind ``jax.pmap``, and the names bound to it in imported modules, to ours.

  Nests: each ``patch()`` needs one ``unpatch()``. Warns (``UnpatchedPmapWarning``) about
  the references to JAX's pmap it found but cannot rebind."""
  _patch(stacklevel=3)


def _patch(stacklevel: int) -> None:
  """``patch()``; ``stacklevel`` points the warning at the user's call."""
  global _depth, _original
  from pmap_compat.api import pmap  # noqa: PLC0415
  unreachable: list[str] = []
  with _lock:
    if _depth == 0:
      _original = jax.pmap
      bindings, unreachable = _search(_original)
      prebuilt, unreadable = _prebuilt(pmap)
      unreachable += unreadable
      jax.pmap = pmap
      _rebound[:] = _rebind(bindings, pmap)
      for b in prebuilt:
        setattr(b.owner, b.name, b.after)
      _rebound.extend(prebuilt)
      for name in _PLACEMENT:
        if name not in vars(jax):
          setattr(jax, name, getattr(placement, name))
          _added.append(name)
    _depth += 1
  if unreachable:
    warnings.warn(
        "pmap_compat.patch(): these references to JAX's pmap cannot be rebound, and calls "
        f"through them keep JAX's pmap: {', '.join(unreachable)}. Create them inside the "
        "patched block, or use pmap_compat.pmap there.", UnpatchedPmapWarning,
        stacklevel=stacklevel)


def unpatch() -> None:
  """Undo one ``patch()``; the last one restores JAX's ``jax.pmap`` and every binding
  ``patch()`` changed."""
  global _depth, _original
  with _lock:
    if _depth == 0:
      raise RuntimeError("pmap_compat.unpatch() called without a matching patch()")
    _depth -= 1
    if _depth == 0:
      assert _original is not None  # set by the patch() this undoes
      jax.pmap = _original
      _original = None
      _restore(_rebound)
      _rebound.clear()
      for name in _added:
        delattr(jax, name)
      _added.clear()


@contextlib.contextmanager
def patched() -> Iterator[None]:
  """``with pmap_compat.patched(): ...`` runs the block with ``jax.pmap`` being ours (see
  the module docstring for the names it reaches and the ones it cannot). Entering the
  outermost block searches the process's objects (about 0.15 s measured with numpyro, flax,
  optax and brax imported, on a busy 2-core machine): enter it around a loop, not in it."""
  _patch(stacklevel=4)  # this generator, contextlib's __enter__, the with statement
  try:
    yield
  finally:
    unpatch()
