"""Arrays the user's function closes over become constants of the per-device program.

Legacy pmap lowers the function's closed jaxpr as the per-device computation itself, so
every concrete array the function closes over (model data, lookup tables) is an HLO
constant there, and XLA treats it as one: it sinks such constants into while-loop
bodies and folds what depends on them alone. A shard_map under jit instead receives
them as operands of its body (jit lowers its own constants at the top level and hands
them through the manual conversion): XLA then sees loop-invariant operands, hoists
different work out of loops, and fuses some products differently, so results can
differ from legacy's in the last bits.

On the JAX lines where legacy pmap is the reference (its runtime is present), the body
is traced once to a jaxpr and evaluated inside a ``jax.jit`` of its own: jit keeps the
concrete constants of a jaxpr it stages inside that jaxpr, so they are lowered as
constants of the per-device function, where legacy has them. Constants that are tracers
of an enclosing transformation stay arguments, as in legacy. Without legacy's runtime
(jax 0.10 on) the release's own ``jax.pmap`` passes constants as operands, and so do we.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Callable

import jax
from jax._src import api_util, core
from jax._src import linear_util as lu
from jax._src.interpreters import partial_eval as pe
from jax.tree_util import tree_structure, tree_unflatten

from pmap_compat import jax_line

# Whether the reference pmap embeds closed-over arrays in its per-device program.
EMBEDS_CONSTANTS: bool = jax_line.LEGACY_PMAP_RUNTIME


def call(dbg: core.DebugInfo, name: str, invoke: Callable[[list], Any], leaves: list) -> Any:
  """``invoke(leaves)`` in the current trace (a per-device body), with the concrete arrays
  it closes over lowered as constants of the per-device code (see the module docstring).

  ``dbg`` describes the user's function and arguments for tracing errors; ``name`` names
  the inner jit in compile logs and profiles.
  """
  if not EMBEDS_CONSTANTS:
    return invoke(leaves)

  def flat(*xs: Any) -> Any:
    return invoke(list(xs))
  wrapped, out_tree = api_util.flatten_fun_nokwargs(lu.wrap_init(flat, debug_info=dbg),
                                                    tree_structure(tuple(leaves)))
  jaxpr, _, consts, *_ = pe.trace_to_jaxpr_dynamic(wrapped, [jax.typeof(x) for x in leaves])
  if all(isinstance(c, core.Tracer) for c in consts):
    outs = core.eval_jaxpr(jaxpr, consts, *leaves)
  else:
    def per_device(*xs: Any) -> list:
      return core.eval_jaxpr(jaxpr, consts, *xs)
    per_device.__name__ = per_device.__qualname__ = name
    outs = jax.jit(per_device)(*leaves)
  return tree_unflatten(out_tree(), outs)

