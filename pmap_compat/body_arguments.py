"""How the pmap body's arguments are described: the user's function and parameter names.

The body shard_map traces takes the call's flat leaves, one block each. Its DebugInfo
is built the way legacy pmap builds its own, from the user's function, the call's
arguments and its static positions: tracing errors then say "while tracing the function
f at file.py:12 for pmap" and name each leaf as the user's parameters do ("argument x",
"argument d['b']", "argument p.b", "argument kw['z']"), in the order of the flat leaves
(positional arguments, then keyword arguments sorted by name, as jit orders them).

A nested pmap runs inside the outer body's trace; ``traced_as`` gives its function a
trace frame of its own, so its errors name the inner function and its parameters too.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable, Iterable, Sequence

import jax
from jax._src import api_util, core
from jax._src import linear_util as lu
from jax._src.interpreters import partial_eval as pe
from jax.tree_util import tree_structure, tree_unflatten

from pmap_compat import errors


def _leaves(*leaves: Any) -> None:
  """Stands for the body when its DebugInfo is built (not called)."""


def debug_info(fun: Callable, args: Sequence[Any], kwargs: dict,
               static: Iterable[int]) -> core.DebugInfo:
  """For a body run on the leaves of ``fun(*args, **kwargs)``'s non-static arguments.

  Built for a stand-in with ``fun``'s signature and source: jax 0.10 would return the
  DebugInfo a ``fun`` made by JAX (e.g. a jit) carries, which describes another trace.
  """
  return api_util.debug_info("pmap", _leaves, args, kwargs, static_argnums=tuple(static),
                             sourceinfo=api_util.fun_sourceinfo(fun),
                             signature=api_util.fun_signature(fun))


def traced_as(dbg: core.DebugInfo, invoke: Callable[[list], Any], leaves: list) -> Any:
  """``invoke(leaves)`` in the current trace, traced first in a frame described by ``dbg``
  (a jaxpr evaluated in place: the same operations, under the caller's trace)."""
  def flat(*xs: Any) -> Any:
    return invoke(list(xs))
  wrapped, out_tree = api_util.flatten_fun_nokwargs(lu.wrap_init(flat, debug_info=dbg),
                                                    tree_structure(tuple(leaves)))
  errors.check_jax_types(leaves)
  jaxpr, _, consts, *_ = pe.trace_to_jaxpr_dynamic(wrapped, [jax.typeof(x) for x in leaves])
  return tree_unflatten(out_tree(), core.eval_jaxpr(jaxpr, consts, *leaves))
