"""The DebugInfo of the pmap body: the user's function and parameter names.

The body shard_map traces takes the call's flat leaves, one block each. Its DebugInfo
is built the way legacy pmap builds its own, from the user's function, the call's
arguments and its static positions: tracing errors then say "while tracing the function
f at file.py:12 for pmap" and name each leaf as the user's parameters do ("argument x",
"argument d['b']", "argument p.b", "argument kw['z']"), in the order of the flat leaves
(positional arguments, then keyword arguments sorted by name, as jit orders them).
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable, Iterable, Sequence

from jax._src import api_util, core


def debug_info(fun: Callable, body: Callable, args: Sequence[Any], kwargs: dict,
               static: Iterable[int]) -> core.DebugInfo:
  """For ``body`` run on the leaves of ``fun(*args, **kwargs)``'s non-static arguments.

  Built for ``body`` with ``fun``'s signature and source: jax 0.10 would return the
  DebugInfo a ``fun`` made by JAX (e.g. a jit) carries, which describes another trace.
  """
  return api_util.debug_info("pmap", body, args, kwargs, static_argnums=tuple(static),
                             sourceinfo=api_util.fun_sourceinfo(fun),
                             signature=api_util.fun_signature(fun))
