"""Structure of transformed shard_maps, compared with JAX's shard_map on the running line.

* the number of collectives in the lowered HLO of gradients (the transpose and
  the efficient-transpose rewrite must not add reductions JAX does not have);
* the specs of the shard_map equations ``grad`` / ``checkpoint`` / ``vmap``
  produce (residual specs per mesh axis, cotangent specs);
* dead-code elimination of outputs, with effects kept;
* numerical gradients (``jax.test_util.check_grads``) of ours.
"""
from __future__ import annotations

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax._src import config as jax_config
from jax._src import core
from jax._src.interpreters import partial_eval as pe
from jax.sharding import PartitionSpec as P

from reference import jax_shard_map, outcomes_or_same_error, vma_mode, vma_params
from shard_map_impl import eqn_params
from support.jax_lines import requires
from support.meshes import make_mesh

COLLECTIVES = ("all_reduce", "all_gather", "collective_permute", "all_to_all",
               "reduce_scatter")


def _impls():
  import shard_map_impl
  return {"jax": jax_shard_map, "ours": shard_map_impl.shard_map}


def rand(*shape, seed=0, dtype=np.float32):
  return np.random.RandomState(seed).randn(*shape).astype(dtype)


# Each case: (mesh shape, build(smap, mesh) -> (function, args)).
def _grad_psum(smap, mesh):
  f = smap(lambda x: lax.psum(jnp.sin(x), 'x'), mesh, P('x'), P())
  return jax.grad(lambda x: jnp.sum(f(x) ** 2)), (rand(16, 2),)


def _grad_replicated_weight(smap, mesh):
  f = smap(lambda x, w: lax.psum(jnp.tanh(x @ w), 'y'), mesh,
           (P('x', 'y'), P('y', None)), P('x'))
  return jax.grad(lambda x, w: jnp.sum(f(x, w) ** 2), argnums=(0, 1)), (rand(8, 4), rand(4, 3))


def _grad_megatron(smap, mesh):
  def body(x, w1, w2):
    return lax.psum(jnp.tanh(x @ w1) @ w2, 'y')
  f = smap(body, mesh, (P('x', None), P(None, 'y'), P('y', None)), P('x'))
  args = (rand(8, 6), rand(6, 4, seed=1), rand(4, 6, seed=2))
  return jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2)), args


def _grad_all_gather(smap, mesh):
  f = smap(lambda x: lax.all_gather(x, 'x', tiled=True) * 2.0, mesh, P('x'), P('x'))
  return jax.grad(lambda x: jnp.sum(jnp.sin(f(x)))), (rand(16),)


def _grad_ppermute_axis_index(smap, mesh):
  perm = [(i, (i + 1) % 8) for i in range(8)]
  def body(x):
    return lax.ppermute(x * lax.axis_index('x'), 'x', perm)
  f = smap(body, mesh, P('x'), P('x'))
  return jax.grad(lambda x: jnp.sum(jnp.cos(f(x)))), (rand(16),)


def _grad_replicated_input(smap, mesh):
  f = smap(lambda x, w: x * w, mesh, (P('x'), P()), P('x'))
  return jax.grad(lambda x, w: jnp.sum(f(x, w) ** 2), argnums=(0, 1)), (rand(8, 2), rand(2))


def _grad_scan(smap, mesh):
  def body(x, w):
    def step(c, xi):
      return jnp.tanh(c * w + xi), c
    c, ys = lax.scan(step, x[0] * 0.0, x)
    return lax.psum(c, 'x'), ys
  f = smap(body, mesh, (P(None, 'x'), P()), (P(), P(None, 'x')))
  return (jax.grad(lambda x, w: sum(jnp.sum(o ** 2) for o in f(x, w)), argnums=(0, 1)),
          (rand(3, 8), rand(1)))


def _grad_remat_policy(smap, mesh):
  def body(x, w):
    h = jnp.sin(x @ w)
    return lax.psum(h @ w.T, 'x')
  f = jax.checkpoint(smap(body, mesh, (P('x'), P()), P()),
                     policy=jax.checkpoint_policies.dots_saveable)
  return jax.grad(lambda x, w: jnp.sum(f(x, w) ** 2), argnums=(0, 1)), (rand(16, 4), rand(4, 4))


def _vmap_spmd(smap, mesh):
  f = smap(lambda x: lax.psum(x, 'x'), mesh, P('x'), P())
  return jax.vmap(f, spmd_axis_name='y'), (rand(4, 8, 3),)


def _grad_mesh_order(smap, mesh):
  def body(x):
    return jnp.sin(x) * lax.psum(jnp.cos(x), ('y', 'x'))
  f = smap(body, mesh, P(('y', 'x')), P(('y', 'x')))
  return jax.grad(lambda x: jnp.sum(f(x) ** 2)), (rand(16, 3),)


def _grad_vmap_spmd_remat(smap, mesh):
  f = jax.checkpoint(smap(lambda x: lax.psum(jnp.sin(x) * x, 'x'), mesh, P('x'), P()))
  g = jax.grad(lambda x: jnp.sum(f(x)))
  return jax.vmap(g, spmd_axis_name='y'), (rand(2, 8, 3),)


CASES = {
    "grad_mesh_order": ((4, 2), _grad_mesh_order),
    "grad_vmap_spmd_remat": ((4, 2), _grad_vmap_spmd_remat),
    "grad_psum": ((8,), _grad_psum),
    "grad_replicated_weight": ((4, 2), _grad_replicated_weight),
    "grad_megatron": ((4, 2), _grad_megatron),
    "grad_all_gather": ((8,), _grad_all_gather),
    "grad_ppermute_axis_index": ((8,), _grad_ppermute_axis_index),
    "grad_replicated_input": ((8,), _grad_replicated_input),
    "grad_scan": ((8,), _grad_scan),
    "grad_remat_policy": ((8,), _grad_remat_policy),
    "vmap_spmd": ((4, 2), _vmap_spmd),
}


def collective_counts(fn, args) -> collections.Counter:
  text = jax.jit(fn).lower(*args).as_text()
  return collections.Counter(
      {c: len(re.findall(rf'"?stablehlo\.{c}"?', text)) for c in COLLECTIVES})


@pytest.mark.parametrize("varying", vma_params(True, False), ids=["vary1", "vary0"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_collective_counts_match(name, varying):
  shape, build = CASES[name]
  with vma_mode(varying):
    counts = outcomes_or_same_error(
        _impls(), lambda smap: collective_counts(*build(smap, make_mesh(shape))))
  assert counts is None or counts["ours"] == counts["jax"]


@pytest.mark.parametrize("name", ["grad_replicated_input", "grad_megatron"])
def test_check_rep_false_costs_conservative_psums(name):
  """check_rep=False must still differentiate correctly; JAX's conservative rule adds
  psums, ours the same number."""
  shape, build = CASES[name]
  counts, values = {}, {}
  for impl_name, smap in _impls().items():
    smap_nocheck = lambda f, m, i, o, smap=smap: smap(f, m, i, o, check_rep=False)
    fn, args = build(smap_nocheck, make_mesh(shape))
    counts[impl_name] = collective_counts(fn, args)
    values[impl_name] = jax.jit(fn)(*args)
  assert counts["ours"] == counts["jax"]
  for a, b in zip(jax.tree.leaves(values["jax"]), jax.tree.leaves(values["ours"]), strict=True):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- equation specs

def _shard_map_eqns(jaxpr: core.Jaxpr):
  """Every shard_map equation (ours or JAX's), depth first, with sub-jaxprs."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "shard_map":
      found.append(eqn)
    for sub in core.jaxprs_in_params(eqn.params):
      found.extend(_shard_map_eqns(sub))
  return found


def _signature(eqn, varying: bool = True):
  """What must agree: every input's spec and per-call type (residual specs per
  mesh axis enter the second half as inputs; cotangent specs enter the
  transpose), and check_rep where it is meaningful.

  Outputs are not compared here (the printed-jaxpr test compares them where
  equations carry jax.shard_map's params).  Without varying-axes types ours binds the halves of split shard_maps with check_rep=False (their
  replication is not re-checked, as JAX's staging does not check it either).
  """
  p = eqn_params.read(eqn.params)
  sig = (_canon(p.in_names), p.rewrite, tuple(str(v.aval) for v in eqn.invars))
  return sig + ((p.check,) if varying else ())


def _canon(names) -> tuple:
  return tuple(tuple(sorted(n.items())) for n in names)


@pytest.mark.parametrize("varying", vma_params(True, False), ids=["vary1", "vary0"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_equation_specs_match(name, varying):
  """Residual and cotangent specs of the transformed equations equal JAX's."""
  shape, build = CASES[name]

  def signatures(smap):
    fn, args = build(smap, make_mesh(shape))
    return [_signature(e, varying) for e in _shard_map_eqns(jax.make_jaxpr(fn)(*args).jaxpr)]
  with vma_mode(varying):
    sigs = outcomes_or_same_error(_impls(), signatures)
  assert sigs is None or sigs["ours"] == sigs["jax"]


JAXPR_COLLECTIVES = ("psum", "psum_invariant", "pvary", "all_gather", "ppermute",
                     "all_to_all", "reduce_scatter", "pmax", "pmin")


def _collective_eqns(jaxpr: core.Jaxpr, counts=None) -> collections.Counter:
  counts = collections.Counter() if counts is None else counts
  for eqn in jaxpr.eqns:
    if eqn.primitive.name in JAXPR_COLLECTIVES:
      counts[eqn.primitive.name] += 1
    for sub in core.jaxprs_in_params(eqn.params):
      _collective_eqns(sub, counts)
  return counts


@pytest.mark.parametrize("varying", vma_params(True, False), ids=["vary1", "vary0"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_jaxpr_collectives_match(name, varying):
  """The same number of each reducing / communicating collective as JAX, and no
  more ``pvary`` (JAX's transpose also builds zero cotangents for residual
  inputs and ``pvary``-s them; ours does not emit those outputs at all)."""
  shape, build = CASES[name]

  def collectives(smap):
    fn, args = build(smap, make_mesh(shape))
    return _collective_eqns(jax.make_jaxpr(fn)(*args).jaxpr)
  with vma_mode(varying):
    counts = outcomes_or_same_error(_impls(), collectives)
  if counts is None:
    return  # JAX's own shard_map fails on this program, and ours the same way
  ours_pvary, jax_pvary = counts["ours"].pop("pvary", 0), counts["jax"].pop("pvary", 0)
  assert counts["ours"] == counts["jax"]
  assert ours_pvary <= jax_pvary


# ------------------------------------------------------- printed jaxprs (0.10)

def _jvp_closed_weight(smap, mesh):
  f = smap(lambda x, w: lax.psum(jnp.sin(x) * w, 'x'), mesh, (P('x'), P()), P())
  return (lambda x, w, t: jax.jvp(lambda x: f(x, w), (x,), (t,))), (rand(8, 2), rand(2),
                                                                  rand(8, 2, seed=1))


def _linearize_apply(smap, mesh):
  f = smap(lambda x: jnp.cos(x) * lax.psum(x, 'x'), mesh, P('x'), P('x'))
  return (lambda x, t: jax.linearize(f, x)[1](t)), (rand(8, 2), rand(8, 2, seed=1))


def _linear_transpose(smap, mesh):
  f = smap(lambda x, w: lax.psum(x * 3.0, 'y') + w, mesh, (P('x', 'y'), P('x')), P('x'))
  x, w = rand(8, 4), rand(8, 2, seed=1)
  return jax.linear_transpose(f, x, w), (rand(8, 2, seed=2),)


def _vmap_unbatched_arg(smap, mesh):
  f = smap(lambda x, w: x @ w, mesh, (P('x'), P(None, 'y')), P('x', 'y'))
  return jax.vmap(f, in_axes=(0, None)), (rand(2, 8, 3), rand(3, 4, seed=1))


def _vmap_out_axis(smap, mesh):
  f = smap(lambda x: lax.all_gather(x, 'x', tiled=True), mesh, P('x'), P('x'))
  return jax.vmap(f, in_axes=0, out_axes=1), (rand(3, 8, 2),)


def _named_residual_body(x, w):
  from jax.ad_checkpoint import checkpoint_name
  h = checkpoint_name(jnp.sin(x @ w), 'h')
  return jnp.tanh(h @ w.T) * lax.psum(jnp.sum(h), 'x')


def _remat_policy(policy):
  def build(smap, mesh):
    f = jax.checkpoint(smap(_named_residual_body, mesh, (P('x'), P()), P('x')), policy=policy)
    return (jax.grad(lambda x, w: jnp.sum(f(x, w)), argnums=(0, 1)),
            (rand(16, 4), rand(4, 4, seed=1)))
  return build


def _grad_check_vma_false(smap, mesh):
  f = smap(lambda x, w: lax.psum(jnp.tanh(x * w), 'y'), mesh, (P('x', 'y'), P()), P('x'),
           check_rep=False)
  return jax.grad(lambda x, w: jnp.sum(f(x, w) ** 2), argnums=(0, 1)), (rand(8, 4), rand(2))


def _grad_scan_of_shard_map(smap, mesh):
  f = smap(lambda c, x: (c * jnp.sin(x), lax.psum(c * x, 'x')), mesh,
           (P('x'), P('x')), (P('x'), P()))
  def loss(c0, xs):
    c, ys = lax.scan(f, c0, xs)
    return jnp.sum(c) + jnp.sum(ys)
  return jax.grad(loss, argnums=(0, 1)), (rand(8), rand(3, 8, seed=1))


def _grad_nested_shard_map(smap, mesh):
  def outer(x):
    # Nested in a body, JAX 0.10 wants the context mesh (x already manual).
    inner = smap(lambda y: lax.psum(y * y, 'y'), jax.sharding.get_abstract_mesh(),
                 P(None, 'y'), P())
    return lax.psum(inner(x), 'x')
  f = smap(outer, mesh, P('x'), P(), auto=frozenset({'y'}))
  return jax.grad(lambda x: jnp.sum(f(x) ** 2)), (rand(8, 4),)


JAXPR_CASES = {
    **CASES,
    "jvp_closed_weight": ((8,), _jvp_closed_weight),
    "linearize_apply": ((8,), _linearize_apply),
    "linear_transpose": ((4, 2), _linear_transpose),
    "vmap_unbatched_arg": ((4, 2), _vmap_unbatched_arg),
    "vmap_out_axis": ((8,), _vmap_out_axis),
    "remat_save_only_these_names": (
        (8,), _remat_policy(jax.checkpoint_policies.save_only_these_names('h'))),
    "remat_offload_names": ((8,), _remat_policy(
        jax.checkpoint_policies.save_and_offload_only_these_names(
            names_which_can_be_saved=(), names_which_can_be_offloaded=('h',),
            offload_src='device', offload_dst='pinned_host'))),
    "grad_check_vma_false": ((4, 2), _grad_check_vma_false),
    "grad_scan_of_shard_map": ((8,), _grad_scan_of_shard_map),
    "grad_nested_shard_map": ((4, 2), _grad_nested_shard_map),
}


@requires("core_shard_map", "equations carry jax.shard_map's own params, so jaxprs "
          "print alike")
@pytest.mark.parametrize("name", sorted(JAXPR_CASES))
def test_printed_jaxpr_matches_jax(name):
  """The whole transformed program prints as JAX's: every equation the rules
  emit (pvary/psum placement, residual and cotangent specs as JAX spells
  them, promoted scalar residuals, dropped zero cotangents), in order."""
  shape, build = JAXPR_CASES[name]

  def printed(smap):
    fn, args = build(smap, make_mesh(shape))
    return _specs_as_tuples(str(jax.make_jaxpr(fn)(*args)))
  text = outcomes_or_same_error(_impls(), printed)
  assert text is None or text["ours"] == text["jax"]


def _specs_as_tuples(text: str) -> str:
  """``out_specs=[a, b]`` printed as ``out_specs=(a, b)``: JAX 0.6.2's partial evaluation
  stages the unknown half's specs as the list it built, later releases (and ours) as a
  tuple; the equation means the same either way. (A spec prints without brackets.)"""
  def as_tuple(match: re.Match) -> str:
    specs = match.group(1)
    return f"out_specs=({specs}{',' if specs.count('PartitionSpec(') == 1 else ''})"
  return re.sub(r"out_specs=\[([^\[\]]*)\]", as_tuple, text)


def _vmap_over_explicit_axis(smap):
  from jax.sharding import AxisType, NamedSharding
  mesh = jax.make_mesh((4, 2), ('x', 'y'), axis_types=(AxisType.Explicit,) * 2)
  x = jax.device_put(rand(4, 8, 3), NamedSharding(mesh, P('x', 'y')))
  with jax.set_mesh(mesh):
    f = smap(lambda v: lax.psum(v, 'y') * v, mesh=mesh, in_specs=P('y'), out_specs=P('y'),
             axis_names=frozenset({'y'}))
    return jax.make_jaxpr(jax.vmap(f))(x), jax.jit(jax.vmap(f))(x)


@requires("explicit_vmap_axes")
def test_vmap_over_explicit_mesh_axis():
  """vmap of an array whose batch dimension is sharded on an Explicit axis:
  the body sees that dimension whole, the result keeps the sharding, as in JAX."""
  import shard_map_impl
  outcomes = {}
  for impl_name, smap in (("jax", jax.shard_map), ("ours", shard_map_impl.shard_map)):
    jaxpr, out = _vmap_over_explicit_axis(smap)
    outcomes[impl_name] = (str(jaxpr), out.sharding.spec, np.asarray(out))
  (want_jaxpr, want_spec, want), (got_jaxpr, got_spec, got) = outcomes["jax"], outcomes["ours"]
  assert (got_jaxpr, got_spec) == (want_jaxpr, want_spec)
  np.testing.assert_array_equal(got, want)


# --------------------------------------------------------------------------- DCE

def _dce_program(smap, mesh):
  def body(x):
    jax.debug.callback(lambda v: None, x)
    return jnp.sin(x), lax.psum(jnp.cos(x), 'x'), x * 2.0
  return smap(body, mesh, P('x'), (P('x'), P(), P('x')))


@pytest.mark.parametrize("used", [(True, False, False), (False, True, True),
                                  (False, False, False)])
def test_dce_prunes_outputs_and_keeps_effects(used):
  results = {}
  for impl_name, smap in _impls().items():
    f = _dce_program(smap, make_mesh((8,)))
    closed = jax.make_jaxpr(f)(rand(8))
    pruned, used_in = pe.dce_jaxpr(closed.jaxpr, list(used))
    eqns = _shard_map_eqns(pruned)
    assert len(eqns) == 1, "the effectful shard_map must survive DCE"
    body = eqns[0].params["jaxpr"]
    results[impl_name] = (used_in, len(eqns[0].outvars), len(body.outvars),
                          sorted(e.primitive.name for e in body.eqns),
                          _signature(eqns[0]),
                          _canon(eqn_params.read(eqns[0].params).out_names))
  assert results["ours"] == results["jax"]


def test_dce_drops_pure_unused_shard_map():
  for smap in _impls().values():
    f = smap(lambda x: jnp.sin(x), make_mesh((8,)), P('x'), P('x'))
    closed = jax.make_jaxpr(lambda x, f=f: (f(x), x)[1])(rand(8))
    pruned, _ = pe.dce_jaxpr(closed.jaxpr, [True])
    assert not _shard_map_eqns(pruned)


# ---------------------------------------------------------- numerical gradients

def _numeric_programs(smap):
  mesh8, mesh42 = make_mesh((8,)), make_mesh((4, 2))
  perm = [(i, (i + 1) % 8) for i in range(8)]
  yield "psum", smap(lambda x: lax.psum(jnp.sin(x) * x, 'x'), mesh8, P('x'), P()), (rand(8, 2),)
  yield "ppermute", smap(lambda x: lax.ppermute(x ** 3, 'x', perm), mesh8, P('x'), P('x')), (rand(8),)
  yield "all_gather", smap(lambda x: jnp.tanh(lax.all_gather(x, 'y', tiled=True)),
                           mesh42, P('x', 'y'), P('x', 'y')), (rand(8, 4),)
  yield "replicated", smap(lambda x, w: lax.psum(jnp.tanh(x * w), 'y'), mesh42,
                           (P('x', 'y'), P()), P('x')), (rand(8, 4), rand(2))
  yield "all_to_all", smap(lambda x: lax.all_to_all(jnp.sin(x), 'x', 0, 1, tiled=True),
                           mesh8, P('x'), P('x')), (rand(64, 8),)


@pytest.mark.parametrize("varying", vma_params(True, False), ids=["vary1", "vary0"])
@pytest.mark.parametrize("check_rep", [True, False], ids=["rep1", "rep0"])
def test_check_grads_numerically(varying, check_rep):
  from jax.test_util import check_grads
  import shard_map_impl
  smap = lambda f, m, i, o: shard_map_impl.shard_map(f, m, i, o, check_rep=check_rep)
  with vma_mode(varying):
    for name, f, args in _numeric_programs(smap):
      args = tuple(a.astype(np.float64) for a in args)
      with jax_config.enable_x64(True):
        order = 2 if name in ("psum", "replicated") else 1
        check_grads(jax.jit(f), args, order=order, modes=("fwd", "rev"),
                    atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------- discharge

def _accumulate(acc_ref, xb):
  acc_ref[...] = acc_ref[...] + lax.psum(jnp.sum(xb, 0), 'x')
  return jnp.sin(xb) * 2.0


def _closed_over_ref(smap, mesh):
  def stateful(refs):
    x_ref, acc_ref = refs
    x_ref[...] = smap(lambda xb: _accumulate(acc_ref, xb), mesh, P('x'), P('x'))(x_ref[...])
  return stateful


def _ref_argument(smap, mesh):
  def stateful(refs):
    x_ref, acc_ref = refs
    mapped = smap(lambda xb, a_ref: _accumulate(a_ref, xb), mesh, (P('x'), P()), P('x'))
    x_ref[...] = mapped(x_ref[...], acc_ref)
  return stateful


@pytest.mark.parametrize("program", [_closed_over_ref, _ref_argument],
                         ids=["closed_over_ref", "ref_argument"])
def test_state_discharge(program):
  """A body updating a ref under ``run_state``: ours discharges it (JAX 0.6.0's
  shard_map has no discharge rule; 0.10.2's fails on a closed-over ref); the
  result must equal the same computation written without refs, run with JAX's
  shard_map."""
  from jax._src.state.discharge import run_state
  import shard_map_impl
  mesh = make_mesh((8,))
  x, acc0 = rand(16, 2), rand(2, seed=1)
  got = jax.jit(run_state(program(shard_map_impl.shard_map, mesh)))((x, acc0))
  pure = jax_shard_map(
      lambda xb, a: (jnp.sin(xb) * 2.0, a + lax.psum(jnp.sum(xb, 0), 'x')),
      mesh, (P('x'), P()), (P('x'), P()))
  want = jax.jit(pure)(x, acc0)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)
