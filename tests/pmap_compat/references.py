"""``compare_with_legacy`` / ``compare_call`` that also hold pmap_compat to the release's
own ``jax.pmap`` where legacy pmap is gone.

On every release support.compare's own applies: legacy in-process where the release has
it (through 0.9.x), and legacy's recording. Where legacy pmap is gone (0.10.0 on) the
recording is one reference (within the documented cross-version ulp), and the release's
``jax.pmap``, where it returns, is a second one: same XLA, so bit for bit unless the test
gives a tolerance. Where that pmap raises (nested pmaps, typed-key collectives, ...) only
the recording applies.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable

from support import compare
from support.legacy_pmap import has_legacy_pmap


def compare_with_legacy(program: Callable[[Any], Any], impl: Any, *, rtol: float | None = None,
                        atol: float | None = None, jax_pmap: bool = True) -> compare.Outcome:
  """``jax_pmap=False``: without legacy in-process, legacy's recording only (for a result
  of the release's jax.pmap that cannot be compared, which the test says)."""
  legacy = compare.compare_with_legacy(program, impl, rtol=rtol, atol=atol)
  if jax_pmap and not has_legacy_pmap():
    compare.compare_with_jax_pmap(program, impl, rtol=rtol, atol=atol)
  return legacy


def compare_call(fun: Callable, args: tuple, impl: Any, *, kwargs: dict | None = None,
                 rtol: float | None = None, atol: float | None = None, jax_pmap: bool = True,
                 **pmap_kwargs: Any) -> compare.Outcome:
  """``compare_with_legacy`` for ``pmap(fun, **pmap_kwargs)(*args, **kwargs)``."""
  call_kwargs = kwargs or {}
  return compare_with_legacy(lambda pmap: pmap(fun, **pmap_kwargs)(*args, **call_kwargs),
                             impl, rtol=rtol, atol=atol, jax_pmap=jax_pmap)
