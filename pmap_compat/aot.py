"""What ``.lower()`` / ``.trace()`` return: jit's stage objects, adjusted to legacy pmap's.

``PmapTraced`` / ``PmapLowered`` / ``PmapCompiled`` are jit's ``Traced`` / ``Lowered`` /
``Compiled`` (same data, same methods), except that the compiled object can also be called
inside ``jax.disable_jit()``, as legacy pmap's can: jit's refuses there.

In multi-process jobs each process passes host-local arguments, like legacy. We lower the
global program (abstract global arguments on the global mesh), and the returned
``Local*`` objects convert host-local arrays to global ones on the way in and back on
the way out (``multihost``), so ``f.lower(x).compile()(x)`` behaves as legacy's does.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable

import jax
import numpy as np
from jax._src import config, core, stages
from jax._src.lib.mlir import ir
from jax.tree_util import tree_flatten, tree_leaves, tree_unflatten

from pmap_compat import errors, inputs, jax_line, multihost, program
from pmap_compat.config import PmapConfig


def _recast(cls: type, staged: Any) -> Any:
  """``staged`` (a jit stage object) as an instance of its subclass ``cls``: the same
  state, copied attribute by attribute (the stage constructors differ between JAX
  lines; their state is all in slots and ``__dict__``)."""
  assert isinstance(staged, cls.__mro__[1]), (cls, type(staged))
  new: Any = object.__new__(cls)
  for klass in type(staged).__mro__:
    for name in getattr(klass, "__slots__", ()):
      if name != "__weakref__" and hasattr(staged, name):
        object.__setattr__(new, name, getattr(staged, name))
  new.__dict__.update(getattr(staged, "__dict__", {}))
  return new


def name_like_legacy(module: ir.Module, fun_name: str) -> None:
  """Names a lowered program as legacy pmap named its programs, ``pmap_<function name>``
  (jit names them ``jit_<name>``): the HLO module name that dumps, ``as_text()`` and
  profiles show. Renamed in place, before it is compiled."""
  with module.context:
    module.operation.attributes["sym_name"] = ir.StringAttr.get(
        jax_line.legacy_program_name(fun_name))


class PmapCompiled(stages.Compiled):
  """jit's ``Compiled``, also callable under ``jax.disable_jit()`` and with arguments on
  other devices or in other layouts (moved on device first), as legacy pmap's is."""

  @classmethod
  def of(cls, compiled: stages.Compiled) -> PmapCompiled:
    return _recast(cls, compiled)

  def __call__(self, *args, **kwargs):
    try:
      return self._run(args, kwargs)
    except ValueError:  # jit's refusal of input shardings; nothing has run yet
      placed = self._placed(args, kwargs)
      if placed is None:
        raise
    except TypeError as err:
      raise errors.as_legacy_type_mismatch(err) from None
    return self._run(*placed)

  def _run(self, args: tuple, kwargs: dict) -> Any:
    if config.disable_jit.value:
      # jit's C++ call path wants the Python function under disable_jit; an executable that
      # is already compiled has nothing to fall back to and just runs, as legacy's does.
      with config.disable_jit(False):
        return super().__call__(*args, **kwargs)
    return super().__call__(*args, **kwargs)

  def _placed(self, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """The arguments moved onto the compiled input shardings; None if none could move."""
    leaves, tree = tree_flatten((args, kwargs))
    targets = tree_leaves(self.input_shardings)
    # jaxlib 0.10 ships no stubs for PyTreeDef, so its hints leave the type unusable.
    if tree != self.in_tree or len(targets) != len(leaves):  # type: ignore[operator, unused-ignore]
      return None  # jit's own error (tree or arity mismatch) says it best
    try:
      moved = inputs.place_leaves(leaves, targets)
    except Exception:  # pylint: disable=broad-except
      return None
    return None if moved is None else tree_unflatten(tree, moved)


class PmapLowered(stages.Lowered):
  """jit's ``Lowered``, its program named as legacy's; ``compile`` returns a
  ``PmapCompiled``."""

  @classmethod
  def of(cls, lowered: stages.Lowered, fun_name: str) -> PmapLowered:
    module = lowered.compiler_ir("stablehlo")
    if module is not None:  # jit's lowerings always have one; the annotation allows None
      name_like_legacy(module, fun_name)
    return _recast(cls, lowered)

  # Legacy's signature: jax 0.10's jit added a device_assignment keyword that pmap never had.
  def compile(self, compiler_options: Any = None) -> PmapCompiled:  # type: ignore[override, unused-ignore]
    return PmapCompiled.of(super().compile(compiler_options))


class PmapTraced(stages.Traced):
  """jit's ``Traced``; ``lower`` returns a ``PmapLowered``."""

  _fun_name: str

  @classmethod
  def of(cls, traced: stages.Traced, fun_name: str) -> PmapTraced:
    new = _recast(cls, traced)
    new._fun_name = fun_name
    return new

  def lower(self, **kwargs) -> PmapLowered:
    return PmapLowered.of(super().lower(**kwargs), self._fun_name)


def as_pmap_stage(staged: stages.Traced | stages.Lowered,
                  fun_name: str) -> PmapTraced | PmapLowered:
  """The pmap flavour of what jit's ``.trace`` / ``.lower`` returned for ``fun_name``."""
  if isinstance(staged, stages.Lowered):
    return PmapLowered.of(staged, fun_name)
  return PmapTraced.of(staged, fun_name)


def global_abstract_args(cfg: PmapConfig, fun: Callable, args: tuple, kwargs: dict,
                         meshes_used: dict) -> tuple[tuple, dict, list]:
  """``args``/``kwargs`` with each dynamic leaf replaced by its global ShapeDtypeStruct."""
  call, mesh, shardings = program.input_shardings(cfg, fun, args, kwargs, False, meshes_used)
  if mesh is None:  # devices= of another size, to be completed by nested pmaps
    raise NotImplementedError(
        "pmap_compat: .lower()/.trace() in a multi-process job needs devices= to match the "
        "mapped size (nested pmaps that complete the device count are found only by tracing)")
  size = mesh.shape[mesh.axis_names[0]]
  structs = []
  for x, d, s in zip(call.leaves, call.in_axes, shardings, strict=True):
    aval = core.shaped_abstractify(x)
    shape = list(np.shape(x))
    if d is not None:
      shape[d] = size
    structs.append(jax.ShapeDtypeStruct(tuple(shape), aval.dtype, sharding=s,
                                        weak_type=aval.weak_type))
  new_args, new_kwargs = call.rebuild(structs)
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


def stage_multiprocess(method: str, jitted: Any, meshes_used: dict, cfg: PmapConfig,
                       fun: Callable, fun_name: str, args: tuple, kwargs: dict) -> Any:
  """``jitted.lower`` or ``jitted.trace`` on the global program, with local conversion."""
  g_args, g_kwargs, targets = global_abstract_args(cfg, fun, args, kwargs, meshes_used)
  staged = as_pmap_stage(getattr(jitted, method)(*g_args, **g_kwargs), fun_name)
  return (LocalLowered if method == "lower" else LocalTraced)(staged, targets)
