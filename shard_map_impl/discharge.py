"""State discharge of a shard_map equation whose body takes refs.

``run_state`` / ``discharge_state`` turn ref effects into value passing.  A
shard_map with ref inputs is discharged into one taking the refs' current
values and returning, after its own outputs, each ref's final value under the
ref's spec; the caller writes those back.  (JAX 0.6.0's own shard_map has no
such rule; 0.10's does.)
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jax._src import core
from jax._src import linear_util as lu
from jax._src.state import discharge as state_discharge
from jax._src.state.types import AbstractRef

from shard_map_impl import debug_names as dn
from shard_map_impl import eqn_params
from shard_map_impl.jax_line import discharge_state
from shard_map_impl.per_device import body_context
from shard_map_impl.out_names import ConstThunk
from shard_map_impl.primitive import shard_map_p
from shard_map_impl.split_residuals import fit_names


def discharge_rule(in_avals: Sequence[core.AbstractValue], out_avals: Sequence[core.AbstractValue],
                   *args: Any, **params: Any) -> tuple[list, list]:
  del out_avals
  p = eqn_params.read(params)
  jaxpr, mesh, in_names, out_names = p.jaxpr, p.mesh, p.in_names, p.out_names
  is_ref = [isinstance(a, AbstractRef) for a in in_avals]
  with body_context(mesh, p.auto, p.check):
    body, consts = discharge_state(jaxpr)
  ref_names = [n for n, r in zip(in_names, is_ref, strict=True) if r]
  n_consts = len(consts)

  def run(*vals: Any):
    return core.eval_jaxpr(body, vals[:n_consts], *vals[n_consts:])

  # After the body's own inputs and outputs come the discharged state's.
  dbg = jaxpr.debug_info
  fun = dn.renamed(lu.wrap_init(run, debug_info=dbg), dbg,
                   (*dn.unnamed(n_consts), *fit_names(dbg.arg_names, len(args))),
                   lambda paths: (*fit_names(paths, len(out_names)),
                                  *dn.unnamed(len(ref_names))))
  outs = shard_map_p.bind(
      fun, *consts, *args,
      mesh=mesh, in_names=(*({} for _ in consts), *in_names),
      out_names_thunk=ConstThunk((*out_names, *ref_names)),
      check_rep=p.check, rewrite=p.rewrite, auto=p.auto)
  n_out = len(out_names)
  finals = iter(outs[n_out:])
  return [next(finals) if r else None for r in is_ref], outs[:n_out]


state_discharge.register_discharge_rule(shard_map_p)(discharge_rule)
