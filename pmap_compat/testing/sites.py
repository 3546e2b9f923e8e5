"""Observing every call of a program's pmap sites, whatever implements them.

A pmap site is one function the program maps over devices: what it handed to `jax.pmap`
(legacy, or JAX's own shard_map-based one), to `pmap_compat.pmap` (also through
`pmap_compat.patched()`), or, in code the codemod converted, to the support module's
`per_device` under shard_map under `jax.jit` (the plain form) or to its `on_pmap_mesh`
under `jax.jit` (sites plain code cannot express; see converted_sites). Its identity is that
function's module and qualified name (functools.partial and `__wrapped__` chains
unwrapped), which the codemod keeps; the file and line are a hint for people. A second
function with the same name (two lambdas in one function) is `name#2`, numbered in the
order the program creates its sites.

`observing(observer)` is a context manager that, while it is active, makes

  - `jax.pmap`, `pmap_compat.pmap` and (when `pmap_compat.api` is already imported)
    `pmap_compat.api.pmap`, which `pmap_compat.patched()` installs, return a `SiteCaller`;
  - `jax.shard_map` (where JAX has it) and `jax.experimental.shard_map.shard_map` (also
    where it is a deprecated alias, its warning kept) remember what they return for a
    support module's `per_device` body, with their arguments, recognised by its code
    (converted_sites);
  - `jax.jit` return a `SiteCaller` for such a function (the plain form: `placed_on` calls
    it; the observer sees the outputs as the program's function returned them), or for a
    function the support module's `on_pmap_mesh` made (recognised by its code), and the
    plain jitted function for anything else.

A `SiteCaller` hands each top-level call (no tracer among the arguments: calls inside
jit, grad or an outer pmap are part of that computation) to `observer.call(caller, args,
kwargs)`, which must return what the call returns (`caller.implementation` makes it;
`caller.stepped(visitor)` is the same site with its loops stepped, see loop_steps: the
pmap, or the shard_map, made again over `loop_steps.stepping` of the function it maps,
jitted as the site was, donation aside); every other attribute is the wrapped
function's. Sites must be created while observing: a pmap or shard_map made before (a
module imported earlier) is not seen. Leaving the context restores every attribute;
SiteCallers made meanwhile call straight through from then on.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import os
import sys
from typing import Any, Protocol
from collections.abc import Callable, Iterator

import jax

from pmap_compat.testing import converted_sites, loop_steps


@dataclasses.dataclass(frozen=True)
class Site:
  """One pmap site: `key` ("module:qualname", "#n" for a later namesake) identifies it."""
  key: str
  module: str
  qualname: str
  file: str | None = None
  line: int | None = None

  @property
  def where(self) -> str:
    return f"{os.path.basename(self.file)}:{self.line}" if self.file and self.line else "?"


class Observer(Protocol):
  active: bool

  def call(self, caller: SiteCaller, args: tuple, kwargs: dict) -> Any: ...


class SiteCaller:
  """What a pmap (or a converted site's jax.jit) returns while observing."""

  def __init__(self, implementation: Callable[..., Any], site: Site, user_function: Any,
               observer: Observer,
               stepped: Callable[[loop_steps.Visitor], Callable[..., Any]] | None = None,
               outputs: converted_sites.Outputs | None = None):
    self._implementation = implementation
    self._observer = observer
    # A plain site's outputs are packed for placed_on: observers see them unpacked.
    self._outputs = outputs
    self.site = site
    self.user_function = user_function
    # visitor -> this site built again (same implementation and options, no donation)
    # with its loops stepped through `visitor` (loop_steps); None where it cannot be.
    self.stepped = stepped
    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
      try:
        object.__setattr__(self, name, getattr(implementation, name))
      except AttributeError:
        pass
    self.__wrapped__ = implementation

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    if self._observer.active and not _traced(args, kwargs):
      if self._outputs is not None:
        args = self._outputs.observed_args(args)
      out = self._observer.call(self, args, kwargs)
      return out if self._outputs is None else self._outputs.packed(out)
    return self._implementation(*args, **kwargs)

  @property
  def implementation(self) -> Callable[..., Any]:
    """The site as it runs, its outputs as the program's function returned them."""
    if self._outputs is None:
      return self._implementation
    return self._outputs.unpacking(self._implementation)

  def __getattr__(self, name: str) -> Any:  # lower, trace, eval_shape, _cache_size, ...
    return getattr(self._implementation, name)

  def __repr__(self) -> str:
    return f"<pmap site {self.site.key} (observed) of {self._implementation!r}>"


def _traced(args: tuple, kwargs: dict) -> bool:
  return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kwargs)))


def user_function(fun: Any) -> Any:
  """The function a site maps: partials, SiteCallers and `__wrapped__` chains unwrapped."""
  seen: set[int] = set()
  while id(fun) not in seen:
    seen.add(id(fun))
    if isinstance(fun, SiteCaller):
      fun = fun.user_function
    elif isinstance(fun, functools.partial):
      fun = fun.func
    elif getattr(fun, "__wrapped__", None) is not None:
      fun = fun.__wrapped__
    else:
      break
  return fun


# The axis name a stepped pmap site gets when the program's pmap had none.
_DEVICE_AXIS = "pmap_compat_testing_device"


class SiteNames:
  """Gives each site its key: module:qualname, with #n for a later namesake."""

  def __init__(self) -> None:
    self._by_code: dict[Any, Site] = {}
    self._taken: dict[str, int] = {}

  def site_of(self, fun: Any) -> Site:
    fun = user_function(fun)
    target = fun if inspect.isfunction(fun) or inspect.ismethod(fun) else type(fun)
    module = str(getattr(target, "__module__", None) or "?")
    qualname = str(getattr(target, "__qualname__", None) or getattr(target, "__name__", "?"))
    code = getattr(target, "__code__", None)
    identity = code if code is not None else target
    if identity not in self._by_code:
      name = f"{module}:{qualname}"
      self._taken[name] = self._taken.get(name, 0) + 1
      key = name if self._taken[name] == 1 else f"{name}#{self._taken[name]}"
      self._by_code[identity] = Site(key, module, qualname,
                                     getattr(code, "co_filename", None),
                                     getattr(code, "co_firstlineno", None))
    return self._by_code[identity]


_MISSING = object()


@contextlib.contextmanager
def observing(observer: Observer) -> Iterator[SiteNames]:
  """Routes the top-level calls of every pmap site created inside the block to `observer`."""
  names = SiteNames()
  shard_maps = converted_sites.ShardMaps()
  saved: list[tuple[Any, str, Any]] = []

  def install(owner: Any, attribute: str, replacement: Any) -> None:
    saved.append((owner, attribute, vars(owner).get(attribute, _MISSING)))
    setattr(owner, attribute, replacement)

  def observed_pmap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def pmap(fun: Any, *args: Any, **kwargs: Any) -> Any:
      mapped = original(fun, *args, **kwargs)
      if isinstance(mapped, SiteCaller):  # pmap_compat's pmap, observed as well
        return mapped

      def stepped(visitor: loop_steps.Visitor) -> Callable[..., Any]:
        # pmap(fun, axis_name=None, *, ...): the steps need an axis name to tell the
        # devices apart; a fresh one where the program gave none changes nothing else.
        options = {k: v for k, v in kwargs.items() if k not in ("donate_argnums", "axis_name")}
        axis_name = (args[0] if args else kwargs.get("axis_name")) or _DEVICE_AXIS
        return original(loop_steps.stepping(fun, axis_name, visitor), axis_name, **options)

      return SiteCaller(mapped, names.site_of(fun), user_function(fun), observer, stepped)
    return pmap

  original_jit = jax.jit

  @functools.wraps(original_jit)
  def jit(*args: Any, **kwargs: Any) -> Any:
    if not args:  # jax.jit(static_argnums=...) as a decorator factory (newer JAX)
      return functools.partial(jit, **kwargs)
    jitted = original_jit(*args, **kwargs)
    options = {k: v for k, v in kwargs.items() if k not in ("donate_argnums", "donate_argnames")}
    plain = shard_maps.get(args[0])
    if plain is not None:
      outputs = converted_sites.Outputs()

      def stepped_plain(visitor: loop_steps.Visitor) -> Callable[..., Any]:
        # The per_device body stepped: its loops are the user function's, seen per device
        # without the mapped axis, as under pmap.
        body = loop_steps.stepping(plain.function, plain.axis_names(), visitor)
        return outputs.unpacking(original_jit(plain.remade(body), *args[1:], **options))

      return SiteCaller(jitted, names.site_of(plain.function), user_function(plain.function),
                        observer, stepped_plain, outputs)
    # A site plain code cannot express: on_pmap_mesh's function, seen whole (its loops are
    # not stepped: nothing rebuilds it over a stepped function).
    mapped = converted_sites.on_pmap_mesh_function(args[0])
    if mapped is None:
      return jitted
    return SiteCaller(jitted, names.site_of(mapped), user_function(mapped), observer, None)

  if getattr(jax, "pmap", None) is not None:
    install(jax, "pmap", observed_pmap(jax.pmap))
  install(jax, "jit", jit)
  if vars(jax).get("shard_map") is not None:
    install(jax, "shard_map", shard_maps.observed(vars(jax)["shard_map"]))
  experimental = importlib.import_module("jax.experimental.shard_map")
  if "shard_map" in vars(experimental):
    install(experimental, "shard_map", shard_maps.observed(experimental.shard_map))
  elif callable(vars(experimental).get("__getattr__")):
    # A deprecated alias (jax 0.8 on), which the module's __getattr__ serves with a warning.
    install(experimental, "__getattr__",
            shard_maps.observed_getattr(vars(experimental)["__getattr__"], "shard_map"))
  api = sys.modules.get("pmap_compat.api")
  if api is not None:
    install(api, "pmap", observed_pmap(api.pmap))
  package = sys.modules.get("pmap_compat")
  if package is not None:
    install(package, "pmap", _lazy_pmap_compat(observed_pmap))
  observer.active = True
  try:
    yield names
  finally:
    observer.active = False
    for owner, attribute, value in reversed(saved):
      if value is _MISSING:
        delattr(owner, attribute)
      else:
        setattr(owner, attribute, value)


def _lazy_pmap_compat(observed_pmap: Callable[[Any], Callable[..., Any]]) -> Callable[..., Any]:
  """`pmap_compat.pmap`, observed, without importing pmap_compat's JAX-internal modules
  before the program uses it (they do not import on every JAX this package supports)."""
  def pmap(fun: Any, *args: Any, **kwargs: Any) -> Any:
    from pmap_compat import api  # pylint: disable=import-outside-toplevel
    return observed_pmap(api.pmap)(fun, *args, **kwargs)
  return pmap
