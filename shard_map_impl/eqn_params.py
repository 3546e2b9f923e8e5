"""The params of a staged ``shard_map_p`` equation, in the installed JAX's layout.

Staged equations carry the params JAX's own shard_map equation has on the
installed release (``jax_line.EQN_PARAMS``), so jaxprs print and compare like JAX's:

* experimental module: ``jaxpr, mesh, in_names, out_names, check_rep, rewrite, auto``
  (``in_names``/``out_names``: per-dimension axis-name dicts; ``auto``: the axes left
  to the compiler);
* core module: ``jaxpr, mesh, in_specs, out_specs, check_vma`` and either
  ``manual_axes`` (every axis manual in the body) or ``newly_manual_axes`` (axes manual
  in an enclosing shard_map are not "newly" manual); specs as ``PartitionSpec`` tuples.

Rule modules never read equation params by name: they ``read`` them into a
``ShardMapParams`` and build new ones with ``to_eqn``, which also attaches the
hidden device witness (see ``device_witness``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Any

from jax._src import core

from shard_map_impl.device_witness import WITNESS_PARAM, witness_for
from shard_map_impl.jax_line import (CHECK_PARAM, EQN_HAS_REWRITE, EQN_HAS_SPECS, EQN_PARAMS,
                                     MANUAL_PARAM)
from shard_map_impl.specs import AnyMesh, AxisNames, canonicalize_spec, names_to_pspec


@dataclasses.dataclass(frozen=True)
class ShardMapParams:
  """What a shard_map equation says, independent of the JAX release.

  ``check`` is check_rep / check_vma; ``rewrite`` whether the body was prepared for
  the efficient transpose (== ``check`` where equations have no ``rewrite`` param);
  ``auto`` the mesh axes left to the compiler.
  """
  jaxpr: core.Jaxpr
  mesh: AnyMesh
  in_names: tuple[AxisNames, ...]
  out_names: tuple[AxisNames, ...]
  check: bool
  rewrite: bool
  auto: frozenset

  def replace(self, **changes: Any) -> ShardMapParams:
    return dataclasses.replace(self, **changes)


def _already_manual(mesh: AnyMesh) -> frozenset:
  return frozenset(getattr(mesh, "manual_axes", ()))


def read(params: dict[str, Any]) -> ShardMapParams:
  """The equation params of a shard_map (ours or JAX's) as ``ShardMapParams``."""
  mesh = params["mesh"]
  check = bool(params[CHECK_PARAM])
  if MANUAL_PARAM == "auto":
    auto = frozenset(params["auto"])
  else:
    manual = frozenset(params[MANUAL_PARAM]) | _already_manual(mesh)
    auto = frozenset(a for a in mesh.axis_names if a not in manual)
  if EQN_HAS_SPECS:
    in_names = tuple(canonicalize_spec(s) for s in params["in_specs"])
    out_names = tuple(canonicalize_spec(s) for s in params["out_specs"])
  else:
    in_names, out_names = tuple(params["in_names"]), tuple(params["out_names"])
  return ShardMapParams(jaxpr=params["jaxpr"], mesh=mesh, in_names=in_names,
                        out_names=out_names, check=check,
                        rewrite=bool(params["rewrite"]) if EQN_HAS_REWRITE else check,
                        auto=auto)


def newly_manual(mesh: AnyMesh, auto: frozenset) -> frozenset:
  """Mesh axes a shard_map makes manual that were not manual already."""
  return frozenset(a for a in mesh.axis_names
                   if a not in auto and a not in _already_manual(mesh))


def to_eqn(p: ShardMapParams, *, replacing: dict[str, Any] | None = None) -> dict[str, Any]:
  """Params for a staged ``shard_map_p`` equation (with its device witness).

  ``replacing``: the params of the equation this one rewrites (DCE, remat, ...);
  the new one then has a witness exactly where that one had (outside of
  tracing, whether an equation is nested in a body cannot be told otherwise).
  """
  fields: dict[str, Any] = dict(jaxpr=p.jaxpr, mesh=p.mesh)
  if EQN_HAS_SPECS:
    fields.update(in_specs=tuple(names_to_pspec(n) for n in p.in_names),
                  out_specs=tuple(names_to_pspec(n) for n in p.out_names))
  else:
    fields.update(in_names=tuple(p.in_names), out_names=tuple(p.out_names))
  fields[CHECK_PARAM] = bool(p.check) if EQN_HAS_SPECS else p.check
  if EQN_HAS_REWRITE:
    fields["rewrite"] = p.rewrite
  if MANUAL_PARAM == "auto":
    fields["auto"] = frozenset(p.auto)
  elif MANUAL_PARAM == "manual_axes":
    fields["manual_axes"] = frozenset(a for a in p.mesh.axis_names if a not in p.auto)
  else:
    fields[MANUAL_PARAM] = newly_manual(p.mesh, p.auto)
  # In JAX's own order (jaxprs print params in insertion order).
  params = {name: fields[name] for name in EQN_PARAMS}
  witness = witness_for(p.mesh) if replacing is None or WITNESS_PARAM in replacing else None
  if witness is not None:
    params[WITNESS_PARAM] = witness
  return params


def make(*, jaxpr: core.Jaxpr, mesh: AnyMesh, in_names: Sequence[AxisNames],
         out_names: Sequence[AxisNames], check_rep: bool, rewrite: bool,
         auto: frozenset[Hashable]) -> dict[str, Any]:
  """``to_eqn`` from keyword arguments named like the bind params."""
  return to_eqn(ShardMapParams(jaxpr=jaxpr, mesh=mesh, in_names=tuple(in_names),
                               out_names=tuple(out_names), check=check_rep,
                               rewrite=rewrite, auto=frozenset(auto)))


def bind_params(p: ShardMapParams) -> dict[str, Any]:
  """The bind params (minus ``out_names_thunk``) re-binding this equation takes."""
  return dict(mesh=p.mesh, in_names=tuple(p.in_names), check_rep=p.check,
              rewrite=p.rewrite, auto=p.auto)
