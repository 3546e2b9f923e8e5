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
from jax._src.lib.mlir.dialects import sdy
from jax.sharding import NamedSharding, Sharding

from shard_map_impl import eqn_params
from shard_map_impl.jax_line import SdyShardingList, check_flag
from shard_map_impl.per_device import axis_env, manual_axes_of
from shard_map_impl.primitive import shard_map_p
from shard_map_impl.specs import AnyMesh, AxisNames, names_to_pspec


class _Region:
  """What one shard_map equation's lowering needs to know about its mesh."""

  def __init__(self, ctx: mlir.LoweringRuleContext, mesh: AnyMesh, auto: frozenset):
    self.mesh, self.auto = mesh, auto
    outer = ctx.module_context.axis_context
    self.outer_manual = (outer.manual_axes
                         if isinstance(outer, sharding_impls.SPMDAxisContext)
                         else frozenset())
    self.manual = frozenset(manual_axes_of(mesh, auto))
    # JAX annotates SPMDAxisContext and manual_proto with Mesh; an AbstractMesh works too.
    self.body_ctx = ctx.module_context.replace(
        axis_context=sharding_impls.SPMDAxisContext(mesh, self.manual))  # type: ignore[arg-type]

  def trivial(self, axes: Iterable[Hashable]) -> bool:
    """A manual region over devices of total size 1 needs no conversion."""
    return prod(self.mesh.shape[a] for a in axes) == 1

  def global_sharding(self, names: AxisNames, aval: core.ShapedArray) -> tuple[
                      Sharding, core.ShapedArray]:
    """The operand's global sharding (physical, for extended dtypes)."""
    sharding = NamedSharding(self.mesh, names_to_pspec(names),
                             _manual_axes=self.outer_manual)
    if dtypes.issubdtype(aval.dtype, dtypes.extended):
      return sharding_impls.physical_sharding(aval, sharding), core.physical_aval(aval)
    return sharding, aval

  def unspecified(self, ndim: int) -> set[int]:
    return set(range(ndim)) if self.auto else set()

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
    result = sharding._to_sdy_sharding(phys.ndim)
    if self.auto:
      for dim in result.dimension_shardings:
        if not dim.axes:
          dim.is_open = True  # let the compiler shard auto axes here
    return result


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
  convert = not region.trivial(region.manual)
  if convert:
    # JAX types avals as AbstractValue; a shard_map's operands are ShapedArrays.
    args = [region.to_manual(ctx, n, g, l, x)  # type: ignore[arg-type]
            for n, g, l, x in zip(in_names, ctx.avals_in, local_in, args, strict=True)]
  with axis_env(region.mesh, region.auto), check_flag(check_rep):
    outs, tokens = mlir.call_lowering(
        "shmap_body", ctx.name_stack, jaxpr, None, region.body_ctx, local_in,
        local_out, ctx.tokens_in, *args, dim_var_values=ctx.dim_var_values,
        arg_names=[_dim_labels(n, a) for n, a in zip(in_names, local_in, strict=True)],
        result_names=[_dim_labels(n, a) for n, a in zip(out_names, local_out, strict=True)])
  ctx.set_tokens_out(tokens)
  if not convert:
    return outs
  return [region.to_global(ctx, n, l, g, x)  # type: ignore[arg-type]  # ShapedArrays
          for n, l, g, x in zip(out_names, local_out, ctx.avals_out, outs, strict=True)]


def _lower_shardy(ctx: mlir.LoweringRuleContext, region: _Region, args: Sequence[Any],
                  jaxpr: core.Jaxpr,
                  in_names: Sequence[AxisNames], out_names: Sequence[AxisNames],
                  check_rep: bool):
  # Axes manual in an enclosing region are already per-device here.
  manual = [a for a in region.mesh.axis_names
            if a in region.manual and a not in region.outer_manual]
  scope = lambda: (axis_env(region.mesh, region.auto), check_flag(check_rep))
  if region.trivial(manual):
    env, rep = scope()
    with env, rep:
      outs, _ = mlir.jaxpr_subcomp(
          region.body_ctx, jaxpr, ctx.name_stack, mlir.TokenSet(), (), *args,
          dim_var_values=ctx.dim_var_values)
    return outs
  shardings = lambda names, avals: SdyShardingList(
      [region.sdy_sharding(n, a) for n, a in zip(names, avals, strict=True)]).build()
  op = sdy.ManualComputationOp(
      [mlir.aval_to_ir_type(a) for a in ctx.avals_out], args,
      shardings(in_names, ctx.avals_in), shardings(out_names, ctx.avals_out),
      sdy.ManualAxesAttr.get(  # type: ignore[attr-defined]  # missing from jaxlib's stubs
          ir.ArrayAttr.get([ir.StringAttr.get(a) for a in manual])))
  block = ir.Block.create_at_start(
      # aval_to_ir_type is typed for tokens too (a tuple); an array aval gives one type.
      op.body, [mlir.aval_to_ir_type(v.aval) for v in jaxpr.invars])  # type: ignore[misc]
  env, rep = scope()
  with ir.InsertionPoint(block), env, rep:
    outs, _ = mlir.jaxpr_subcomp(
        region.body_ctx, jaxpr, ctx.name_stack, mlir.TokenSet(), (),
        *block.arguments, dim_var_values=ctx.dim_var_values)  # type: ignore[misc]  # iterable
    sdy.ReturnOp([ir.Value(o) for o in outs])  # type: ignore[arg-type]  # one value per output
  return op.results


def _lower(ctx: mlir.LoweringRuleContext, *args: Any, **params: Any):
  p = eqn_params.read(params)
  region = _Region(ctx, p.mesh, p.auto)
  lower = _lower_shardy if config.use_shardy_partitioner.value else _lower_gspmd
  return lower(ctx, region, list(args), p.jaxpr, p.in_names, p.out_names, p.check)


mlir.register_lowering(shard_map_p, _lower)
