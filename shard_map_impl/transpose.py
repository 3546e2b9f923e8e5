"""Transposition of a staged shard_map equation (reverse mode).

The transpose is itself a shard_map: per device it takes the non-zero output
cotangents and the non-linear (residual) inputs, replays the body's
non-linear part to recover its residuals, runs ``ad.backward_pass`` over the
linear part, and returns the cotangents of the linear inputs, each under its
input's spec (and, where JAX's own transpose does so, zero cotangents of the
residual inputs too, so the staged equation is JAX's).

How replicated values are reduced depends on the equation's ``rewrite`` flag:

* ``rewrite=True`` (``check_rep=True``; on 0.10 ``check_vma=True``): the body already says exactly where
  values go from replicated to varying (``pvary``, inserted implicitly with
  varying-axes types, or by the efficient-transpose rewrite without them) and
  back (``psum``), and those primitives transpose into each other.  Nothing
  is added here.
* ``rewrite=False`` (``check_rep``/``check_vma`` off): nothing is known, so the
  rule is conservative: each output cotangent is divided by the size of the
  axes its spec leaves unmentioned (the value was claimed equal there), and
  each input cotangent is ``psum``-med over the axes its spec leaves
  unmentioned (only axes this shard_map makes manual count).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from math import prod

from jax import lax
from jax._src import ad_util
from jax._src import core
from jax._src import dtypes
from jax._src import linear_util as lu
from jax._src.interpreters import ad
from jax._src.interpreters import partial_eval as pe

from shard_map_impl import debug_names as dn
from shard_map_impl import eqn_params
from shard_map_impl.eqn_params import newly_manual
from shard_map_impl.jax_line import (BACKWARD_PASS_EVALUATES_NONLINEAR,
                                     TRANSPOSE_COUNTS_COTANGENT_SPECS,
                                     TRANSPOSE_PARTIAL_EVALUATES, cotangent_aval,
                                     name_derived_body, undefined_primal_aval,
                                     zero_cotangent_aval)
from shard_map_impl.out_names import DerivedNames
from shard_map_impl.primitive import shard_map_p
from shard_map_impl.specs import AnyMesh, AxisNames, cotangent_names, partial_sums, spec_axes


def _replicated_axes(mesh: AnyMesh, names: AxisNames, auto: frozenset) -> tuple:
  """Axes this shard_map makes manual that a cotangent's spec leaves unmentioned
  (mesh order); an unreduced cotangent is not replicated along its unreduced axes.

  Auto axes, axes already manual outside and vmap-spmd axes are not counted.
  """
  spmd = set(core.get_axis_env().spmd_axis_names)
  manual = newly_manual(mesh, auto)
  used = spec_axes(names) | partial_sums(names)[0] | spmd
  return tuple(a for a in mesh.axis_names if a in manual and a not in used)


def _divide_for_replication(ct: Any, size: int):
  if size == 1 or dtypes.dtype(ct) == dtypes.float0:
    return ct
  return ct / size


class _TransposeBody:
  """The per-device function the transposed shard_map runs."""

  def __init__(self, jaxpr: core.Jaxpr, linear: list[bool], ct_given: list[bool],
               reduce_in: list[tuple]):
    self.jaxpr = jaxpr
    self.linear = linear
    self.ct_given = ct_given
    self.reduce_in = reduce_in  # per linear input: axes to psum its cotangent over
    self.nonzero_out: list[bool] | None = None

  def __call__(self, *args: Any):
    n_ct = sum(self.ct_given)
    given_cts, res_args = args[:n_ct], args[n_ct:]
    given_iter = iter(given_cts)
    cts = [next(given_iter) if g else ad.Zero(cotangent_aval(v.aval))
           for v, g in zip(self.jaxpr.outvars, self.ct_given, strict=True)]
    in_cts = self._linear_cotangents(res_args, cts)
    reduce_iter = iter(self.reduce_in)
    results = []
    for ct in in_cts:
      axes = next(reduce_iter)
      if type(ct) is not ad.Zero and axes and dtypes.dtype(ct) != dtypes.float0:
        ct = lax.psum(ct, axes)
      results.append(ct)
    if TRANSPOSE_PARTIAL_EVALUATES:
      # As JAX's transpose there: every input gets a cotangent, residuals zeros.
      lin_iter, res_iter = iter(results), iter(res_args)
      results = [next(lin_iter) if lin else ad_util.zero_from_primal(next(res_iter))
                 for lin in self.linear]
    self.nonzero_out = [type(ct) is not ad.Zero for ct in results]
    return [ct for ct in results if type(ct) is not ad.Zero]

  def _linear_cotangents(self, res_args: Sequence[Any], cts: Sequence[Any]) -> list:
    if BACKWARD_PASS_EVALUATES_NONLINEAR and not TRANSPOSE_PARTIAL_EVALUATES:
      res_iter = iter(res_args)
      primals = [ad.UndefinedPrimal(undefined_primal_aval(v.aval)) if lin else next(res_iter)
                 for v, lin in zip(self.jaxpr.invars, self.linear, strict=True)]
      all_cts = ad.backward_pass(self.jaxpr, False, (), primals, cts)
      return [ct for ct, lin in zip(all_cts, self.linear, strict=True) if lin]
    # Separate the body into the part computable from the residual inputs
    # and the part linear in the undefined inputs, then transpose the latter. (Closed here,
    # not by pe.close_jaxpr, whose cache entry would keep the body alive.)
    known_jaxpr, linear_jaxpr, out_unknown, _ = pe.partial_eval_jaxpr_nounits(
        core.ClosedJaxpr(self.jaxpr, ()), self.linear, False)
    res = core.jaxpr_as_fun(known_jaxpr)(*res_args)
    n_known_outs = len(out_unknown) - sum(out_unknown)
    res = res[n_known_outs:]
    undefined = [ad.UndefinedPrimal(v.aval)
                 for v, lin in zip(self.jaxpr.invars, self.linear, strict=True) if lin]
    lin_cts = [ct for ct, unk in zip(cts, out_unknown, strict=True) if unk]
    all_cts = ad.backward_pass(linear_jaxpr.jaxpr, False, linear_jaxpr.consts,
                               [*res, *undefined], lin_cts)
    return all_cts[len(res):]


def transpose_rule(out_cts: Sequence[Any], *args: Any, **params: Any) -> list:
  p = eqn_params.read(params)
  jaxpr, mesh, in_names, out_names = p.jaxpr, p.mesh, p.in_names, p.out_names
  check_rep, rewrite, auto = p.check, p.rewrite, p.auto
  linear = [ad.is_undefined_primal(x) for x in args]
  ct_given = [type(ct) is not ad.Zero for ct in out_cts]
  # Cotangents travel under their primals' specs with partial sums swapped.
  in_ct_names = tuple(map(cotangent_names, in_names))
  out_ct_names = tuple(map(cotangent_names, out_names))
  # The axes a cotangent is replicated along, read from the specs JAX reads them from.
  out_counted, in_counted = ((out_ct_names, in_ct_names) if TRANSPOSE_COUNTS_COTANGENT_SPECS
                             else (out_names, in_names))
  given = []
  for ct, names, g in zip(out_cts, out_counted, ct_given, strict=True):
    if g:
      scale = 1 if rewrite else prod(mesh.shape[a] for a in _replicated_axes(mesh, names, auto))
      given.append(_divide_for_replication(ct, scale))
  linear_names = [n for n, lin in zip(in_ct_names, linear, strict=True) if lin]
  reduce_in = [() if rewrite else _replicated_axes(mesh, n, auto)
               for n, lin in zip(in_counted, linear, strict=True) if lin]
  body = _TransposeBody(jaxpr, linear, ct_given, reduce_in)
  res_args = [x for x, lin in zip(args, linear, strict=True) if not lin]
  res_names = [n for n, lin in zip(in_names, linear, strict=True) if not lin]
  ct_names = [n for n, g in zip(out_ct_names, ct_given, strict=True) if g]

  # The outputs' names: of the linear inputs' cotangents (of every input's, residual
  # zeros included, where JAX's transpose returns those).
  result_names = in_ct_names if TRANSPOSE_PARTIAL_EVALUATES else linear_names

  def out_names_thunk():
    return tuple(n for n, nz in zip(result_names, body.nonzero_out, strict=True) if nz)

  # Inputs (cotangents, residuals) and outputs (cotangents) are derived values.
  fun = name_derived_body(
      lu.wrap_init(body, debug_info=jaxpr.debug_info),
      lambda f: dn.renamed(f, jaxpr.debug_info, dn.unnamed(len(given) + len(res_args)),
                           lambda _: dn.unnamed(sum(body.nonzero_out or ()))))
  outs = shard_map_p.bind(
      fun, *given, *res_args, mesh=mesh, in_names=(*ct_names, *res_names),
      out_names_thunk=DerivedNames(out_names_thunk, ("T", id(body))),
      check_rep=check_rep, rewrite=rewrite, auto=auto)
  out_iter = iter(outs)
  assert body.nonzero_out is not None  # set when the bind above traced the body
  nz_iter = iter(body.nonzero_out)
  result: list[Any] = []
  for x, lin in zip(args, linear, strict=True):
    if not lin:
      if TRANSPOSE_PARTIAL_EVALUATES and next(nz_iter):
        next(out_iter)  # a residual's zero cotangent: not returned
      result.append(None)
    elif next(nz_iter):
      result.append(next(out_iter))
    else:
      result.append(ad.Zero(zero_cotangent_aval(x)))
  return result


ad.primitive_transposes[shard_map_p] = transpose_rule
