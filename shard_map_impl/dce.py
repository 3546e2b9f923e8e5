"""Dead-code elimination of a staged shard_map equation.

Unused outputs are dropped from the equation and its body, then inputs the
pruned body no longer reads.  An equation whose body has effects (callbacks,
ordered IO, ...) is kept even when none of its outputs is used.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from jax._src import core
from jax._src.interpreters import partial_eval as pe

from shard_map_impl import eqn_params
from shard_map_impl.jax_line import eqn_effects
from shard_map_impl.per_device import body_context
from shard_map_impl.primitive import shard_map_p


def _keep(seq: Sequence[Any], mask: Sequence[bool]):
  return [x for x, m in zip(seq, mask, strict=True) if m]


def dce_rule(used_outputs: list[bool], eqn: core.JaxprEqn
             ) -> tuple[list[bool], core.JaxprEqn | None]:
  if not any(used_outputs) and not pe.has_effects(eqn):
    return [False] * len(eqn.invars), None
  p = eqn_params.read(eqn.params)
  # The body context makes jaxpr checks (jax_enable_checks) see the axis
  # env and varying-axes typing the body was traced with.
  with body_context(p.mesh, p.auto, p.check, abstract_mesh=False):
    body, used_inputs = pe.dce_jaxpr(p.jaxpr, used_outputs)
  if not body.effects and not any(used_outputs):
    return used_inputs, None
  new_params = eqn_params.to_eqn(p.replace(
      jaxpr=body, in_names=tuple(_keep(p.in_names, used_inputs)),
      out_names=tuple(_keep(p.out_names, used_outputs))), replacing=eqn.params)
  invars = _keep(eqn.invars, used_inputs)
  new_eqn = pe.new_jaxpr_eqn(
      invars, _keep(eqn.outvars, used_outputs), eqn.primitive, new_params,
      eqn_effects(body, invars, p.mesh.axis_names), eqn.source_info, eqn.ctx)
  return used_inputs, new_eqn


pe.dce_rules[shard_map_p] = dce_rule
