"""MLIR lowering of shard_map under both partitioners.

GSPMD (jax 0.6.0 default): every operand is annotated with its global
sharding and converted to a per-device (manual) value with
``SPMDFullToShardShape``; the body is emitted as a called function
(``shmap_body``) that threads effect tokens; results go back through
``SPMDShardToFullShape``.

Shardy (``jax_use_shardy_partitioner``): one ``sdy.manual_computation`` op
whose region is the inlined body, with per-operand ``TensorSharding``s.

In both, ``auto`` axes stay under the compiler's control: GSPMD marks all
dimensions unspecified, Shardy leaves unsharded dimensions open.  Axes already
manual in an enclosing shard_map are excluded from the conversion.
"""
from __future__ import annotations

from math import prod
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from jax._src import config
from jax._src import core
from jax._src import dtypes
from jax._src import sharding_impls
from jax._src.interpreters import mlir
from jax._src.interpreters import pxla
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import hlo, sdy
from jax.sharding import Sharding

from shard_map_impl import eqn_params
from shard_map_impl.jax_line import (SHARDY_REGION_THREADS_STATE, build_sdy_shardings, check_flag,
                                     gspmd_conversion_axes, ir_type, jaxpr_constants,
                                     lower_call, lower_inline, region_is_partial,
                                     region_sharding, sdy_region_sharding)
from shard_map_impl.per_device import axis_env, manual_axes_of
from shard_map_impl.primitive import shard_map_p
from shard_map_impl.specs import AnyMesh, AxisNames, names_to_pspec


class _Region:
  """What one shard_map equation's lowering needs to know about its mesh."""

  def __init__(self, ctx: mlir.LoweringRuleContext, mesh: AnyMesh, auto: frozenset):
    self.mesh, self.auto = mesh, auto
    outer = ctx.module_context.axis_context
    self.outer_manual = frozenset(getattr(mesh, "manual_axes", ())) | (
        outer.manual_axes if isinstance(outer, sharding_impls.SPMDAxisContext) else frozenset())
    self.manual = frozenset(manual_axes_of(mesh, auto))
    # Made manual here (not already in an enclosing region), in mesh order.
    self.newly = [a for a in mesh.axis_names if a in self.manual and a not in self.outer_manual]
    self.partial = region_is_partial(mesh, auto, frozenset(self.newly), shardy=False)
    self.sdy_partial = region_is_partial(mesh, auto, frozenset(self.newly), shardy=True)
    # JAX annotates SPMDAxisContext and manual_proto with Mesh; an AbstractMesh works too.
    self.body_ctx = ctx.module_context.replace(
        axis_context=sharding_impls.SPMDAxisContext(mesh, self.manual))  # type: ignore[arg-type]

  def trivial(self, axes: Iterable[Hashable]) -> bool:
    """A manual region over devices of total size 1 needs no conversion."""
    return prod(self.mesh.shape[a] for a in axes) == 1

  def global_sharding(self, names: AxisNames, aval: core.ShapedArray) -> tuple[
                      Sharding, core.ShapedArray]:
    """The operand's global sharding (physical, for extended dtypes)."""
    sharding = region_sharding(self.mesh, names_to_pspec(names), self.outer_manual)
    if dtypes.issubdtype(aval.dtype, dtypes.extended):
      return sharding_impls.physical_sharding(aval, sharding), core.physical_aval(aval)
    return sharding, aval

  def unspecified(self, ndim: int) -> set[int]:
    return set(range(ndim)) if self.partial else set()

  # GSPMD ----------------------------------------------------------------------

  def to_manual(self, ctx: mlir.LoweringRuleContext, names: AxisNames,
                global_aval: core.ShapedArray, local_aval: core.ShapedArray,
                x: ir.Value) -> ir.Value:
    sharding, phys = self.global_sharding(names, global_aval)
    free = self.unspecified(phys.ndim)
    annotated = mlir.wrap_with_sharding_op(
        ctx, x, phys, sharding._to_xla_hlo_sharding(phys.ndim).to_proto(),
        unspecified_dims=free)
    manual = pxla.manual_proto(phys, self.manual, self.mesh)  # type: ignore[arg-type]
    return mlir.wrap_with_full_to_shard_op(ctx, annotated, local_aval, manual, free)

  def to_global(self, ctx: mlir.LoweringRuleContext, names: AxisNames,
                local_aval: core.ShapedArray, global_aval: core.ShapedArray,
                x: ir.Value) -> ir.Value:
    sharding, phys_out = self.global_sharding(names, global_aval)
    phys_in = (core.physical_aval(local_aval)
               if dtypes.issubdtype(local_aval.dtype, dtypes.extended) else local_aval)
    free = self.unspecified(phys_out.ndim)
    manual = pxla.manual_proto(phys_in, self.manual, self.mesh)  # type: ignore[arg-type]
    annotated = mlir.wrap_with_sharding_op(ctx, x, phys_in, manual,
                                           unspecified_dims=free)
    return mlir.wrap_with_shard_to_full_op(
        ctx, annotated, global_aval,
        sharding._to_xla_hlo_sharding(phys_out.ndim).to_proto(), free)

  # Shardy ---------------------------------------------------------------------

  def sdy_sharding(self, names: AxisNames, aval: core.ShapedArray) -> Any:
    sharding, phys = self.global_sharding(names, aval)
    return sdy_region_sharding(sharding, phys.ndim, self.sdy_partial)


def _dim_labels(names: dict, aval: core.AbstractValue) -> str:
  """Readable per-dim axis annotation for the body's arguments/results."""
  if not isinstance(aval, core.ShapedArray):
    return ""
  return str([names.get(d) for d in range(aval.ndim)])


def _lower_gspmd(ctx: mlir.LoweringRuleContext, region: _Region, args: Sequence[Any],
                 jaxpr: core.Jaxpr, in_names:
                 Sequence[AxisNames], out_names: Sequence[AxisNames], check_rep: bool):
  local_in = [v.aval for v in jaxpr.invars]
  local_out = [v.aval for v in jaxpr.outvars]
  convert = not region.trivial(gspmd_conversion_axes(region.manual, region.newly))
  if convert:
    # JAX types avals as AbstractValue; a shard_map's operands are ShapedArrays.
    args = [region.to_manual(ctx, n, g, l, x)  # type: ignore[arg-type]
            for n, g, l, x in zip(in_names, ctx.avals_in, local_in, args, strict=True)]
  with axis_env(region.mesh, region.auto), check_flag(check_rep):
    outs, tokens = lower_call(
        ctx, "shmap_body", jaxpr, region.body_ctx, local_in, local_out, args,
        [_dim_labels(n, a) for n, a in zip(in_names, local_in, strict=True)],
        [_dim_labels(n, a) for n, a in zip(out_names, local_out, strict=True)])
  ctx.set_tokens_out(tokens)
  if not convert:
    return outs
  return [region.to_global(ctx, n, l, g, x)  # type: ignore[arg-type]  # ShapedArrays
          for n, l, g, x in zip(out_names, local_out, ctx.avals_out, outs, strict=True)]


def _lower_shardy(ctx: mlir.LoweringRuleContext, region: _Region, args: Sequence[Any],
                  jaxpr: core.Jaxpr,
                  in_names: Sequence[AxisNames], out_names: Sequence[AxisNames],
                  check_rep: bool):
  mc = ctx.module_context
  # Ordered-effect tokens always enter the region as leading arguments (the body's
  # callbacks need them); dimension variables and hoisted constants do where the JAX
  # line threads them (see jax_line.SHARDY_REGION_THREADS_STATE).
  threads = SHARDY_REGION_THREADS_STATE
  effects: list[core.Effect] = list(mlir.effects_lib.ordered_effects.filter_in(jaxpr.effects))
  tokens = [ctx.tokens_in.get(e) for e in effects]
  scope = lambda: (axis_env(region.mesh, region.auto), check_flag(check_rep))
  if region.trivial(region.newly):
    env, rep = scope()
    with env, rep:
      outs, tokens_out = lower_inline(ctx, region.body_ctx, jaxpr,
                                      mlir.TokenSet(dict(zip(effects, tokens, strict=True))),
                                      args, dim_var_values=ctx.dim_var_values)
    ctx.set_tokens_out(tokens_out)
    return outs
  consts = jaxpr_constants(jaxpr)
  const_values = [mlir.ir_constant(c, const_lowering=ctx.const_lowering, aval=a)  # type: ignore[attr-defined, call-arg, unused-ignore]  # other JAX line
                  for c, a in consts] if consts else []
  dim_vars: list[ir.Value] = list(ctx.dim_var_values) if threads else []
  replicated = region.sdy_sharding({}, core.dim_value_aval())  # type: ignore[arg-type, unused-ignore]  # other JAX line
  build = lambda shardings: build_sdy_shardings(mc, shardings)
  in_shardings = ([replicated] * (len(dim_vars) + len(tokens))
                  + [region.sdy_sharding({}, a) for _, a in consts]  # type: ignore[arg-type, unused-ignore]  # other JAX line
                  + [region.sdy_sharding(n, a)  # type: ignore[arg-type, unused-ignore]  # other JAX line
                     for n, a in zip(in_names, ctx.avals_in, strict=True)])
  out_shardings = ([replicated] * len(tokens)
                   + [region.sdy_sharding(n, a)
                      for n, a in zip(out_names, ctx.avals_out, strict=True)])
  token_type = [hlo.TokenType.get()] * len(tokens)  # type: ignore[attr-defined, unused-ignore]  # other JAX line
  op = sdy.ManualComputationOp(
      token_type + [ir_type(mc, a) for a in ctx.avals_out],
      [*dim_vars, *tokens, *const_values, *args],
      build(in_shardings), build(out_shardings),
      sdy.ManualAxesAttr.get(  # type: ignore[attr-defined, unused-ignore]  # not in 0.6's stubs
          # 0.10's stubs say a list; an ArrayAttr is a sequence of attributes to it as well.
          ir.ArrayAttr.get([ir.StringAttr.get(a) for a in region.newly])))  # type: ignore[arg-type, unused-ignore]
  int_type = ir_type(mc, core.dim_value_aval())
  block = ir.Block.create_at_start(
      op.body, [int_type] * len(dim_vars) + token_type
      + [ir_type(mc, a) for _, a in consts] + [ir_type(mc, v.aval) for v in jaxpr.invars])
  env, rep = scope()
  with ir.InsertionPoint(block), env, rep:
    block_args = list(block.arguments)  # type: ignore[call-overload, unused-ignore]  # other JAX line
    n_dims, n_tok, n_const = len(dim_vars), len(tokens), len(consts)
    dim_args = block_args[:n_dims] if threads else list(ctx.dim_var_values)
    tok_args = block_args[n_dims:n_dims + n_tok]
    const_args = block_args[n_dims + n_tok:n_dims + n_tok + n_const]
    in_args = block_args[n_dims + n_tok + n_const:]
    lowering = {(id(c), a): v for (c, a), v in zip(consts, const_args, strict=True)}
    outs, tokens_out = lower_inline(
        ctx, region.body_ctx, jaxpr, mlir.TokenSet(dict(zip(effects, tok_args, strict=True))),
        in_args, dim_var_values=dim_args, const_lowering=lowering if threads else None)
    returned = [*(t for _, t in tokens_out.items()), *outs]
    sdy.ReturnOp([ir.Value(o) for o in returned])  # type: ignore[arg-type, unused-ignore]  # one value each
  ctx.set_tokens_out(ctx.tokens_in.update_tokens(mlir.TokenSet(
      dict(zip(effects, op.results[:len(tokens)], strict=True)))))
  return op.results[len(tokens):]


def _lower(ctx: mlir.LoweringRuleContext, *args: Any, **params: Any):
  p = eqn_params.read(params)
  region = _Region(ctx, p.mesh, p.auto)
  lower = _lower_shardy if config.use_shardy_partitioner.value else _lower_gspmd
  return lower(ctx, region, list(args), p.jaxpr, p.in_names, p.out_names, p.check)


mlir.register_lowering(shard_map_p, _lower)
