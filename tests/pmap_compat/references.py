"""``compare_with_legacy`` / ``compare_call`` that also hold pmap_compat to 0.10.2's own
``jax.pmap`` where that runs.

On jax 0.6.0 they are support.compare's (legacy in-process, plus its recording). Off it,
the recording of legacy is one reference (within the documented cross-version ulp), and
0.10.2's ``jax.pmap``, where it returns, is a second one: same XLA, so bit for bit unless
the test gives a tolerance. Where 0.10.2's pmap raises (nested pmaps, typed-key
collectives, ...) only the recording applies.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable

from support import compare
from support.jax_lines import on_legacy_line


def compare_with_legacy(program: Callable[[Any], Any], impl: Any, *, rtol: float | None = None,
                        atol: float | None = None, jax_pmap: bool = True) -> compare.Outcome:
  """``jax_pmap=False``: legacy's recording only (for a result of 0.10.2's jax.pmap that
  cannot be compared, which the test says)."""
  legacy = compare.compare_with_legacy(program, impl, rtol=rtol, atol=atol)
  if jax_pmap and not on_legacy_line():
    compare.compare_with_jax_pmap(program, impl, rtol=rtol, atol=atol)
  return legacy


def compare_call(fun: Callable, args: tuple, impl: Any, *, kwargs: dict | None = None,
                 rtol: float | None = None, atol: float | None = None, jax_pmap: bool = True,
                 **pmap_kwargs: Any) -> compare.Outcome:
  """``compare_with_legacy`` for ``pmap(fun, **pmap_kwargs)(*args, **kwargs)``."""
  call_kwargs = kwargs or {}
  return compare_with_legacy(lambda pmap: pmap(fun, **pmap_kwargs)(*args, **call_kwargs),
                             impl, rtol=rtol, atol=atol, jax_pmap=jax_pmap)
