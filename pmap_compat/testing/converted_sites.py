"""Sites the codemod converted, recognised by what they are.

The codemod writes most sites as plain JAX over two functions of its support module
(`pmap_shard_map.py`, or a notebook's support cell):

  placed_on(mesh, specs)(jax.jit(jax.shard_map(per_device(f), mesh=mesh, ...)))

(decorators in the same order, or `jax.experimental.shard_map.shard_map` where the
program's JAX has no `jax.shard_map`). The support module has no hook for testing
tools; a site is recognised by its parts instead:

  - `per_device(f)` returns a function whose code object is `per_device.<locals>.body`
    in a file whose first line is a support module's header (`functools.wraps(f)` hides
    everything else: its `__qualname__` is f's, its `__wrapped__` is f);
  - `body` hands each out_axes subtree of f's outputs to `placed_on` packed as one pytree
    node, `jax.tree_util.Partial(treedef.unflatten, leaves)` (its children the subtree's
    leaves, its function the subtree's treedef's `unflatten`), which `placed_on` calls
    outside jit. `Outputs` unpacks them for an observer and packs what the observer
    returns again;
  - `placed_on` holds static arguments in the support module's `_Static` (a tuple, a
    pytree without leaves) through jit and shard_map: observers get their values.

Sites plain code cannot express go through `on_pmap_mesh`, whose function is recognised
by its code (`_sharded.<locals>.sharded`, which `functools.wraps` the function it maps).
"""
from __future__ import annotations

import dataclasses
import functools
import linecache
import sys
import warnings
import weakref
from typing import Any
from collections.abc import Callable

import jax

# The first line of a file holding the support code (a written support module: v9 on,
# v6-v8, v3-v5; a notebook's support cell); per_device is newer than the v1/v2 headers'
# bodies.
_HEADERS = ('"""Helpers for pmap-to-shmap\'s output (v', '"""pmap-to-shmap support v',
            "# pmap-to-shmap support module v",
            "# Support code pmap-to-shmap added for this notebook's converted pmap sites:")
_BODY = "per_device.<locals>.body"
_SHARDED = "_sharded.<locals>.sharded"  # what on_pmap_mesh returns


def _support_file(filename: str) -> bool:
  # linecache also reads IPython's cells, which have no file on disk.
  return linecache.getline(filename, 1).lstrip("\ufeff").startswith(_HEADERS)


def _made_by(fun: Any, qualname: str) -> bool:
  """Is `fun` the support module's function of that qualified name (its code's)?"""
  code = getattr(fun, "__code__", None)
  if code is None:
    return False
  own = getattr(code, "co_qualname", None)  # Python 3.11+
  named = own == qualname if own is not None else code.co_name == qualname.rsplit(".", 1)[-1]
  return named and _support_file(code.co_filename)


def _is_body(fun: Any) -> bool:
  return _made_by(fun, _BODY)


def on_pmap_mesh_function(fn: Any) -> Any | None:
  """The function `fn` maps, if the support module's `on_pmap_mesh` made `fn`; else None."""
  return getattr(fn, "__wrapped__", None) if _made_by(fn, _SHARDED) else None


def per_device_body(fun: Any) -> Any | None:
  """The support module's `per_device` body among `fun`, the partials and the
  `__wrapped__` chain under it; None where there is none."""
  seen: set[int] = set()
  while fun is not None and id(fun) not in seen:
    seen.add(id(fun))
    if _is_body(fun):
      return fun
    fun = fun.func if isinstance(fun, functools.partial) else getattr(fun, "__wrapped__", None)
  return None


def _is_packed(x: Any) -> bool:
  """One of `body`'s packed output subtrees: a Partial of a treedef's `unflatten`."""
  return (isinstance(x, jax.tree_util.Partial)
          and isinstance(getattr(x.func, "__self__", None), jax.tree_util.PyTreeDef))


def _unpacked(x: Any) -> Any:
  return x() if _is_packed(x) else x


def _is_static(x: Any) -> bool:
  """A static argument as `placed_on` holds it: `(value,)` in the support module's
  `_Static`, a tuple registered as a pytree without leaves."""
  kind = type(x)
  module = sys.modules.get(kind.__module__)
  return (isinstance(x, tuple) and kind.__qualname__ == "_Static"
          and _support_file(getattr(module, "__file__", None) or ""))


class Outputs:
  """A plain site's outputs: unpacked for observers, packed again for `placed_on`; and
  its static arguments, which observers see as their values and the site gets held."""

  def __init__(self) -> None:
    self._packed: Any = None  # the treedef of the last outputs as `body` packed them
    self._static: dict[int, type] = {}  # position -> the class holding it, last call

  def observed_args(self, args: tuple) -> tuple:
    """`args` as the program passed them to the site: static ones as their values."""
    self._static = {i: type(x) for i, x in enumerate(args) if _is_static(x)}
    return tuple(x[0] if i in self._static else x for i, x in enumerate(args))

  def held_args(self, args: tuple) -> tuple:
    """`args` as `placed_on` passes them: the static positions of the last call held."""
    return tuple(self._static[i]((x,)) if i in self._static else x
                 for i, x in enumerate(args))

  def unpacked(self, out: Any) -> Any:
    self._packed = jax.tree_util.tree_structure(out)
    return jax.tree_util.tree_map(_unpacked, out, is_leaf=_is_packed)

  def packed(self, out: Any) -> Any:
    """`out` (the unpacked outputs, or leaves in their place) packed as `body` packs them."""
    if self._packed is None:  # no call ran: nothing was unpacked
      return out
    return jax.tree_util.tree_unflatten(self._packed, jax.tree_util.tree_leaves(out))

  def unpacking(self, fun: Callable[..., Any]) -> Callable[..., Any]:
    return _Unpacking(fun, self)


class _Unpacking:
  """`fun` with its outputs unpacked; `lower` and the rest are fun's."""

  def __init__(self, fun: Callable[..., Any], outputs: Outputs):
    self._fun, self._outputs = fun, outputs

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    return self._outputs.unpacked(self._fun(*self._outputs.held_args(args), **kwargs))

  def __getattr__(self, name: str) -> Any:
    return getattr(self._fun, name)


@dataclasses.dataclass(frozen=True)
class ShardMapped:
  """What one shard_map call over a `per_device` body was given: enough to make it again."""
  shard_map: Callable[..., Any]  # JAX's own (not the observed one)
  function: Any  # what it mapped: the per_device body (or what wraps it)
  args: tuple
  kwargs: dict

  def axis_names(self) -> tuple[Any, ...]:
    """The mesh axes the site maps over (manual ones, where the call names them)."""
    mesh = self.kwargs.get("mesh", self.args[0] if self.args else None)
    if mesh is None:
      raise ValueError("its shard_map names no mesh")
    manual = self.kwargs.get("axis_names") or ()
    return tuple(name for name in mesh.axis_names if not manual or name in manual)

  def remade(self, function: Any) -> Any:
    return self.shard_map(function, *self.args, **self.kwargs)


class ShardMaps:
  """The functions shard_map returned for per_device bodies, by identity, while alive."""

  def __init__(self) -> None:
    self._made: dict[int, tuple[weakref.ref, ShardMapped]] = {}

  def observed(self, original: Callable[..., Any]) -> Callable[..., Any]:
    """`original` (a shard_map) remembering what it made for a per_device body."""
    @functools.wraps(original)
    def shard_map(f: Any = None, *args: Any, **kwargs: Any) -> Any:
      if f is None:  # jax.shard_map(mesh=..., ...) as a decorator factory
        return functools.partial(shard_map, *args, **kwargs)
      mapped = original(f, *args, **kwargs)
      if per_device_body(f) is not None:
        try:
          ref = weakref.ref(mapped)
        except TypeError:  # not weakly referenceable: this site goes unobserved
          return mapped
        key = id(mapped)
        self._made[key] = (ref, ShardMapped(original, f, args, kwargs))
        weakref.finalize(mapped, self._made.pop, key, None)
      return mapped
    return shard_map

  def observed_getattr(self, original: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """A module's `__getattr__` serving the deprecated alias `name` (a shard_map), observed:
    its DeprecationWarning is given again from here, to whoever asked (setting the attribute
    instead would hide it)."""
    observed: dict[int, Any] = {}

    def __getattr__(attribute: str) -> Any:
      if attribute != name:
        return original(attribute)
      with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = original(attribute)
      try:
        for warning in caught:
          # stacklevel 2: the frame that asked for the attribute, as the original's.
          warnings.warn(warning.message, warning.category, stacklevel=2)
      except Warning:
        # An error by the filters: the original (functools.cache) must not keep the value
        # it would not have returned, so that the next access warns again.
        getattr(original, "cache_clear", lambda: None)()
        raise
      if id(value) not in observed:
        observed[id(value)] = (value, self.observed(value))
      return observed[id(value)][1]
    return __getattr__

  def get(self, fun: Any) -> ShardMapped | None:
    entry = self._made.get(id(fun))
    return entry[1] if entry is not None and entry[0]() is fun else None
