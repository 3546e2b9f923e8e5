"""Differential catalog: programs run through JAX's shard_map and ours.

Each ``Case`` builds, for a given shard_map implementation and mesh, a mapped
function and its arguments.  The runner (``run_case``) applies it eagerly or
under ``jax.jit``; tests compare the two implementations' outcomes.  Programs
are written against ``mesh.axis_names`` so they run on every standard mesh
(``first`` is the leading axis, ``rest`` the others, ``every`` all of them).
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from support.jax_lines import has
from reference import pvary

lax = jax.lax


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  build: Callable  # (shard_map, mesh) -> (mapped_fun, args)
  meshes: tuple = ((8,), (4, 2), (2, 2, 2))
  eager: bool = True  # also run outside jit
  jit: bool = True  # also run under jit
  # JAX 0.6.0 itself breaks on this program without varying-axes types
  # (e.g. its replication rewrite lacks a rule), so there is nothing to match.
  needs_vma: bool = False
  # ... the same, for eager execution only (JAX's eager replication checks
  # without vma are stricter than its jit path).
  eager_needs_vma: bool = False


CASES: list[Case] = []


def case(name=None, meshes=((8,), (4, 2), (2, 2, 2)), eager=True, jit=True,
         needs_vma=False, eager_needs_vma=False):
  def register(build):
    CASES.append(Case(name or build.__name__, build, tuple(meshes), eager, jit,
                      needs_vma, eager_needs_vma))
    return build
  return register


def first(mesh):
  return mesh.axis_names[0]


def last(mesh):
  return mesh.axis_names[-1]


def every(mesh):
  return tuple(mesh.axis_names)


def arr(*shape, dtype=np.float32, start=0):
  n = int(np.prod(shape))
  return (np.arange(start, start + n) % 17 - 5).astype(dtype).reshape(shape) / (
      1 if np.issubdtype(dtype, np.integer) else 4)


# --- elementwise and structural -------------------------------------------------

@case()
def sin_sharded(sm, mesh):
  return sm(jnp.sin, mesh, in_specs=P(first(mesh)), out_specs=P(first(mesh))), (arr(16, 3),)


@case()
def add_sharded_and_replicated(sm, mesh):
  f = lambda x, y: x * 3 + y
  return sm(f, mesh, in_specs=(P(first(mesh)), P()), out_specs=P(first(mesh))), (arr(8, 4), arr(4))


@case()
def two_dim_sharding(sm, mesh):
  spec = P(first(mesh), last(mesh))
  return sm(lambda x: jnp.tanh(x) - x, mesh, in_specs=spec, out_specs=spec), (arr(8, 8),)


@case()
def multi_axis_entry(sm, mesh):
  spec = P(every(mesh))
  return sm(lambda x: x ** 2 + 1, mesh, in_specs=spec, out_specs=spec), (arr(16),)


@case()
def reshape_inside(sm, mesh):
  f = lambda x: x.reshape(-1, 2).sum(1)
  return sm(f, mesh, in_specs=P(first(mesh)), out_specs=P(first(mesh))), (arr(16, 4),)


@case()
def transpose_inside(sm, mesh):
  f = lambda x: x.T
  return sm(f, mesh, in_specs=P(first(mesh), None), out_specs=P(None, first(mesh))), (arr(8, 3),)


@case()
def matmul_contract_sharded(sm, mesh):
  ax = first(mesh)
  f = lambda a, b: lax.psum(a @ b, ax)
  return sm(f, mesh, in_specs=(P(None, ax), P(ax, None)), out_specs=P()), (arr(4, 16), arr(16, 3))


@case()
def local_sum_then_psum(sm, mesh):
  f = lambda x: lax.psum(x.sum(), every(mesh))
  return sm(f, mesh, in_specs=P(every(mesh)), out_specs=P()), (arr(32),)


@case()
def cumsum_inside(sm, mesh):
  f = lambda x: jnp.cumsum(x, axis=0)
  return sm(f, mesh, in_specs=P(first(mesh)), out_specs=P(first(mesh))), (arr(16, 2),)


@case()
def argmax_inside(sm, mesh):
  # check_rep=False: with varying-axes types on, lowering argmax trips JAX's
  # own type check (a jax 0.6.0 quirk), which is not what this case is about.
  f = lambda x: jnp.argmax(x, axis=1)
  return sm(f, mesh, in_specs=P(first(mesh)), out_specs=P(first(mesh)),
            check_rep=False), (arr(8, 5),)


@case()
def integer_ops(sm, mesh):
  f = lambda x: (x * 7) // 3 + (x % 5)
  return sm(f, mesh, in_specs=P(first(mesh)), out_specs=P(first(mesh))), (arr(16, dtype=np.int32),)


@case()
def where_and_compare(sm, mesh):
  f = lambda x, y: jnp.where(x > y, x, -y)
  spec = P(last(mesh))
  return sm(f, mesh, in_specs=(spec, spec), out_specs=spec), (arr(8), arr(8, start=3))


@case()
def concatenate_inside(sm, mesh):
  f = lambda x, y: jnp.concatenate([x, y, x], axis=1)
  spec = P(first(mesh))
  return sm(f, mesh, in_specs=(spec, spec), out_specs=spec), (arr(8, 2), arr(8, 1))


@case()
def sort_inside(sm, mesh):
  f = lambda x: jnp.sort(x, axis=-1)
  return sm(f, mesh, in_specs=P(first(mesh)), out_specs=P(first(mesh))), (arr(8, 7, start=4),)


@case()
def iota_broadcast(sm, mesh):
  f = lambda x: x + jnp.arange(x.shape[-1], dtype=x.dtype)[None, :]
  return sm(f, mesh, in_specs=P(first(mesh)), out_specs=P(first(mesh))), (arr(8, 6),)


@case()
def transcendental(sm, mesh):
  f = lambda x: jnp.exp(x) + jnp.log1p(jnp.abs(x)) + x ** 3
  return sm(f, mesh, in_specs=P(every(mesh)), out_specs=P(every(mesh))), (arr(16),)


@case()
def complex_values(sm, mesh):
  f = lambda x: (x * (1 + 2j)).conj() * x
  return sm(f, mesh, in_specs=P(first(mesh)), out_specs=P(first(mesh))), (
      arr(8, dtype=np.float32).astype(np.complex64),)


@case()
def bfloat16_values(sm, mesh):
  f = lambda x: (x * 3).astype(jnp.bfloat16) + 1
  return sm(f, mesh, in_specs=P(first(mesh)), out_specs=P(first(mesh))), (arr(16),)


@case()
def random_with_replicated_key(sm, mesh):
  ax = first(mesh)
  def f(key, x):
    key = jax.random.fold_in(key, lax.axis_index(ax))
    return x + jax.random.normal(key, x.shape)
  return sm(f, mesh, in_specs=(P(), P(ax)), out_specs=P(ax)), (jax.random.key(3), arr(8, 2))


@case()
def random_bits_raw_key(sm, mesh):
  def f(key):
    return jax.random.uniform(key, (2,))
  return sm(f, mesh, in_specs=P(), out_specs=P()), (jax.random.PRNGKey(0),)


@case()
def dynamic_slice_by_axis_index(sm, mesh):
  ax = first(mesh)
  def f(table):
    i = lax.axis_index(ax)
    return lax.dynamic_slice_in_dim(table, i, 1)
  return sm(f, mesh, in_specs=P(), out_specs=P(ax)), (arr(mesh.shape[ax], 3),)


@case()
def scalar_output_replicated(sm, mesh):
  f = lambda x: lax.pmax(jnp.max(x), every(mesh))
  return sm(f, mesh, in_specs=P(every(mesh)), out_specs=P()), (arr(16),)


@case()
def rank_expanding_output(sm, mesh):
  f = lambda x: x.sum(keepdims=True)
  return sm(f, mesh, in_specs=P(every(mesh)), out_specs=P(every(mesh))), (arr(16),)


# --- collectives ------------------------------------------------------------------

@case()
def psum_first(sm, mesh):
  ax = first(mesh)
  return sm(lambda x: lax.psum(x, ax), mesh, in_specs=P(ax), out_specs=P()), (arr(16, 2),)


@case()
def psum_every(sm, mesh):
  ax = every(mesh)
  return sm(lambda x: lax.psum(x, ax), mesh, in_specs=P(ax), out_specs=P()), (arr(16),)


@case()
def psum_last_keeps_first(sm, mesh):
  f, l = first(mesh), last(mesh)
  return sm(lambda x: lax.psum(x, l), mesh, in_specs=P(f, l),
            out_specs=P(f) if f != l else P()), (arr(8, 8),)


@case()
def pmax_pmin(sm, mesh):
  ax = first(mesh)
  f = lambda x: (lax.pmax(x, ax), lax.pmin(x, ax))
  return sm(f, mesh, in_specs=P(ax), out_specs=(P(), P())), (arr(8, 3, start=5),)


@case()
def pmean_every(sm, mesh):
  ax = every(mesh)
  return sm(lambda x: lax.pmean(x, ax), mesh, in_specs=P(ax), out_specs=P()), (arr(8, 2),)


@case()
def psum_of_replicated(sm, mesh):
  ax = first(mesh)
  return sm(lambda x: lax.psum(x, ax), mesh, in_specs=P(), out_specs=P()), (arr(3),)


@case()
def psum_pytree(sm, mesh):
  ax = first(mesh)
  f = lambda t: lax.psum(t, ax)
  return sm(f, mesh, in_specs=P(ax), out_specs=P()), ({"a": arr(8), "b": arr(8, 2)},)


@case()
def psum_int(sm, mesh):
  ax = every(mesh)
  return sm(lambda x: lax.psum(x, ax), mesh, in_specs=P(ax), out_specs=P()), (
      arr(8, dtype=np.int32),)


@case()
def all_gather_untiled(sm, mesh):
  ax = first(mesh)
  f = lambda x: lax.all_gather(x, ax)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8, 2),)


@case()
def all_gather_tiled(sm, mesh):
  ax = first(mesh)
  f = lambda x: lax.all_gather(x, ax, tiled=True)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8, 2),)


@case()
def all_gather_axis1(sm, mesh):
  ax = last(mesh)
  f = lambda x: lax.all_gather(x, ax, axis=1, tiled=True)
  return sm(f, mesh, in_specs=P(None, ax), out_specs=P(None, ax)), (arr(3, 8),)


@case()
def all_gather_every(sm, mesh):
  ax = every(mesh)
  f = lambda x: lax.all_gather(x, ax, tiled=True)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(16),)


@case()
def all_to_all_same_axis(sm, mesh):
  ax = first(mesh)
  n = mesh.shape[ax]
  f = lambda x: lax.all_to_all(x, ax, 0, 0, tiled=True)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(n * n, 2),)


@case()
def all_to_all_split1_concat0(sm, mesh):
  ax = first(mesh)
  n = mesh.shape[ax]
  f = lambda x: lax.all_to_all(x, ax, 1, 0, tiled=True)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(None, ax)), (arr(n * 2, n * 3),)


@case()
def all_to_all_untiled(sm, mesh):
  ax = first(mesh)
  n = mesh.shape[ax]
  f = lambda x: lax.all_to_all(x.reshape(n, -1), ax, 0, 0)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(n * n),)


@case()
def ppermute_ring(sm, mesh):
  ax = first(mesh)
  n = mesh.shape[ax]
  f = lambda x: lax.ppermute(x, ax, [(i, (i + 1) % n) for i in range(n)])
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8, 2),)


@case()
def ppermute_swap_last(sm, mesh):
  ax = last(mesh)
  n = mesh.shape[ax]
  f = lambda x: lax.ppermute(x, ax, [(i, n - 1 - i) for i in range(n)])
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


@case()
def ppermute_partial(sm, mesh):
  ax = first(mesh)
  f = lambda x: lax.ppermute(x, ax, [(0, 1)])
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8, 2),)


@case()
def psum_scatter_tiled(sm, mesh):
  ax = first(mesh)
  n = mesh.shape[ax]
  f = lambda x: lax.psum_scatter(x, ax, tiled=True)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(n * n * 2),)


@case()
def psum_scatter_untiled(sm, mesh):
  ax = first(mesh)
  n = mesh.shape[ax]
  f = lambda x: lax.psum_scatter(x.reshape(n, -1), ax, scatter_dimension=0)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(n * n * 2),)


@case()
def axis_index_first(sm, mesh):
  ax = first(mesh)
  f = lambda x: x + lax.axis_index(ax)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


@case()
def axis_index_every(sm, mesh):
  ax = every(mesh)
  f = lambda x: x * lax.axis_index(ax)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


@case()
def axis_index_as_output(sm, mesh):
  ax = last(mesh)
  f = lambda: lax.axis_index(ax)[None]
  return sm(f, mesh, in_specs=(), out_specs=P(ax)), ()


@case()
def psum_axis_index_groups(sm, mesh):
  ax = first(mesh)
  n = mesh.shape[ax]
  groups = [list(range(0, n, 2)), list(range(1, n, 2))]
  f = lambda x: lax.psum(x, ax, axis_index_groups=groups)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


@case()
def collectives_chain(sm, mesh):
  ax = every(mesh)
  def f(x):
    y = lax.all_gather(x, ax, tiled=True)
    z = lax.psum_scatter(y * 2, ax, tiled=True)
    return lax.pmax(z, ax)
  return sm(f, mesh, in_specs=P(ax), out_specs=P()), (arr(16),)


@case(meshes=((4, 2), (2, 2, 2)))
def psum_two_axes_separately(sm, mesh):
  a, b = mesh.axis_names[:2]
  f = lambda x: lax.psum(lax.psum(x, a), b)
  return sm(f, mesh, in_specs=P(a, b), out_specs=P()), (arr(8, 4),)


@case(meshes=((4, 2), (2, 2, 2)))
def all_gather_over_pair(sm, mesh):
  pair = mesh.axis_names[:2]
  f = lambda x: lax.all_gather(x, pair, tiled=True)
  return sm(f, mesh, in_specs=P(pair), out_specs=P(pair)), (arr(16),)


@case(meshes=((4, 2), (2, 2, 2)))
def reduce_over_unmentioned_axis(sm, mesh):
  a, b = mesh.axis_names[:2]
  f = lambda x: lax.psum(x, b)  # x replicated over b: psum multiplies
  return sm(f, mesh, in_specs=P(a), out_specs=P(a)), (arr(8),)


# --- control flow -------------------------------------------------------------------

@case()
def cond_replicated_pred(sm, mesh):
  ax = first(mesh)
  def f(p, x):
    return lax.cond(p > 0, lambda v: v * 2, lambda v: -v, x)
  return sm(f, mesh, in_specs=(P(), P(ax)), out_specs=P(ax)), (np.float32(1.0), arr(8))


@case()
def cond_varying_pred(sm, mesh):
  ax = first(mesh)
  def f(x):
    return lax.cond(lax.axis_index(ax) % 2 == 0, jnp.sin, jnp.cos, x)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8, 2),)


@case()
def cond_branch_collective(sm, mesh):
  ax = first(mesh)
  def f(p, x):
    return lax.cond(p > 0, lambda v: lax.psum(v, ax), lambda v: lax.psum(v * 2, ax), x)
  return sm(f, mesh, in_specs=(P(), P(ax)), out_specs=P()), (np.float32(-1.0), arr(8))


@case()
def switch_three(sm, mesh):
  ax = first(mesh)
  def f(i, x):
    return lax.switch(i, [jnp.sin, jnp.cos, lambda v: v + 1], x)
  return sm(f, mesh, in_specs=(P(), P(ax)), out_specs=P(ax)), (np.int32(2), arr(8))


@case()
def while_counter(sm, mesh):
  ax = first(mesh)
  def f(x):
    return lax.while_loop(lambda c: c[0] < 5, lambda c: (c[0] + 1, c[1] * 1.5), (0, x))[1]
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


# Under jit XLA rejects the device-dependent trip count (PartitionId).
@case(jit=False, eager_needs_vma=True)
def while_varying_trip_count(sm, mesh):
  ax = first(mesh)
  def f(x):
    n = lax.axis_index(ax)
    return lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] + 1.0), (0, x))[1]
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


@case()
def fori_psum(sm, mesh):
  ax = first(mesh)
  def f(x):
    return lax.fori_loop(0, 3, lambda i, c: lax.psum(c, ax) / 4, x)
  return sm(f, mesh, in_specs=P(ax), out_specs=P()), (arr(8),)


@case()
def scan_carry(sm, mesh):
  ax = first(mesh)
  def f(xs):
    def body(c, x):
      return c + x, c * x
    return lax.scan(body, jnp.zeros(xs.shape[1:], xs.dtype), xs)
  return sm(f, mesh, in_specs=P(None, ax), out_specs=(P(ax), P(None, ax))), (arr(4, 8),)


@case()
def scan_psum_body(sm, mesh):
  ax = first(mesh)
  def f(x):
    def body(c, _):
      return lax.psum(c, ax) * 0.5, c.sum()
    return lax.scan(body, x, None, length=3)
  return sm(f, mesh, in_specs=P(ax), out_specs=(P(), P(None))), (arr(8),)


@case()
def scan_carry_becomes_varying(sm, mesh):
  ax = first(mesh)
  def f(x):
    def body(c, _):
      return c + x, None
    return lax.scan(body, jnp.zeros_like(x), None, length=2)[0]
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


@case()
def scan_carry_pvary(sm, mesh):
  ax = first(mesh)
  def f(xs):
    def body(c, x):
      return c + x, c * x
    init = pvary(jnp.zeros(xs.shape[1:], xs.dtype), ax)
    return lax.scan(body, init, xs)
  return sm(f, mesh, in_specs=P(None, ax), out_specs=(P(ax), P(None, ax))), (arr(4, 8),)


@case()
def fori_psum_pvary(sm, mesh):
  ax = first(mesh)
  def f(x):
    return lax.fori_loop(0, 3, lambda i, c: pvary(lax.psum(c, ax) / 4, ax), x)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


@case(eager_needs_vma=True)
def while_replicated_carry_psum(sm, mesh):
  ax = first(mesh)
  def f(x):
    total = lax.psum(jnp.abs(x).sum(), ax) + 1.0
    return lax.while_loop(lambda c: c < 100.0, lambda c: c * 2 + total, 1.0)
  return sm(f, mesh, in_specs=P(ax), out_specs=P()), (arr(8),)


@case()
def lax_map_inside(sm, mesh):
  ax = first(mesh)
  f = lambda x: lax.map(lambda r: r.sum() * r, x)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8, 3),)


@case()
def scan_over_cond(sm, mesh):
  ax = first(mesh)
  def f(xs):
    def body(c, x):
      c = lax.cond(x.sum() > 0, lambda: c + x, lambda: c - x)
      return c, c
    return lax.scan(body, jnp.zeros(xs.shape[1:]), xs)[1]
  return sm(f, mesh, in_specs=P(None, ax), out_specs=P(None, ax)), (arr(3, 8),)


# --- pytrees -------------------------------------------------------------------------

class Pair(NamedTuple):
  a: Any
  b: Any


@case()
def dict_in_out(sm, mesh):
  ax = first(mesh)
  f = lambda d: {"sum": d["u"] + d["v"], "u": d["u"] * 2}
  return sm(f, mesh, in_specs=({"u": P(ax), "v": P(ax)},),
            out_specs={"sum": P(ax), "u": P(ax)}), ({"u": arr(8), "v": arr(8, start=1)},)


@case()
def prefix_spec_for_tuple(sm, mesh):
  ax = first(mesh)
  f = lambda t: (t[0] * t[1], t[1])
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), ((arr(8, 2), arr(8, 2, start=3)),)


@case()
def none_spec_unsharded_arg(sm, mesh):
  ax = first(mesh)
  f = lambda x, scale: x * scale
  return sm(f, mesh, in_specs=(P(ax), None), out_specs=P(ax)), (arr(8), 3.0)


@case()
def namedtuple_outputs(sm, mesh):
  ax = first(mesh)
  f = lambda x: Pair(x + 1, lax.psum(x, ax))
  return sm(f, mesh, in_specs=P(ax), out_specs=Pair(P(ax), P())), (arr(8),)


@case()
def list_outputs(sm, mesh):
  ax = every(mesh)
  f = lambda x: [x, x * 2, lax.psum(x, ax)]
  return sm(f, mesh, in_specs=P(ax), out_specs=[P(ax), P(ax), P()]), (arr(8),)


@case()
def out_specs_thunk(sm, mesh):
  ax = first(mesh)
  f = lambda x: (x, lax.psum(x, ax))
  return sm(f, mesh, in_specs=P(ax), out_specs=lambda: (P(ax), P())), (arr(8),)


@case()
def empty_args_constant_out(sm, mesh):
  f = lambda: jnp.arange(4.0)
  return sm(f, mesh, in_specs=(), out_specs=P()), ()


@case()
def kwargs_free_multiple_args(sm, mesh):
  ax = first(mesh)
  f = lambda a, b, c: (a + b) * c
  return sm(f, mesh, in_specs=(P(ax), P(ax), P()), out_specs=P(ax)), (arr(8), arr(8), arr(1))


# --- jit, remat, custom rules, callbacks ---------------------------------------------

@case()
def jit_inside(sm, mesh):
  ax = first(mesh)
  f = lambda x: jax.jit(lambda y: jnp.cos(y) * 2)(x)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


@case()
def jit_inside_with_psum(sm, mesh):
  ax = first(mesh)
  f = lambda x: jax.jit(lambda y: lax.psum(y, ax))(x)
  return sm(f, mesh, in_specs=P(ax), out_specs=P()), (arr(8),)


@case(eager=False)
def two_shard_maps_in_one_jit(sm, mesh):
  ax = first(mesh)
  g = sm(lambda x: x * 2, mesh, in_specs=P(ax), out_specs=P(ax))
  h = sm(lambda x: lax.psum(x, ax), mesh, in_specs=P(ax), out_specs=P())
  return (lambda x: h(g(x) + 1)), (arr(8),)


@case(eager=False)
def jit_around_with_outer_ops(sm, mesh):
  ax = first(mesh)
  g = sm(lambda x: x.sum(0, keepdims=True), mesh, in_specs=P(ax), out_specs=P(ax))
  return (lambda x: jnp.sin(g(x * 3)) @ jnp.ones((2, 2))), (arr(16, 2),)


@case(eager=False)
def closure_over_outer_jit_tracer(sm, mesh):
  ax = first(mesh)
  x = arr(8)
  return (lambda y: sm(lambda v: lax.psum(v * y, ax), mesh, in_specs=P(ax),
                       out_specs=P())(x)), (np.float32(3),)


@case(eager=False)
def none_spec_outer_jit_tracer(sm, mesh):
  ax = first(mesh)
  x = arr(8, 2)
  return (lambda y: sm(lambda v, s: v * s, mesh, in_specs=(P(ax), None),
                       out_specs=P(ax))(x, y)), (np.float32(-2),)


@case()
def closed_over_array(sm, mesh):
  ax = first(mesh)
  c = jnp.arange(4.0)
  f = lambda x: x * c
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8, 4),)


@case()
def closed_over_scalar(sm, mesh):
  ax = first(mesh)
  f = lambda x: x * 2.5 + 1
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


@case()
def remat_inside(sm, mesh):
  ax = first(mesh)
  f = lambda x: jax.checkpoint(lambda y: jnp.sin(y) * y)(x)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


@jax.custom_jvp
def _softclip(x):
  return jnp.tanh(x) * 2


_softclip.defjvp(lambda p, t: (_softclip(p[0]), t[0] * 2))


@jax.custom_vjp
def _scaled(x):
  return x * 3


_scaled.defvjp(lambda x: (_scaled(x), None), lambda _, g: (g * 3,))


@case()
def custom_jvp_inside(sm, mesh):
  ax = first(mesh)
  return sm(_softclip, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


@case()
def custom_vjp_inside(sm, mesh):
  ax = first(mesh)
  f = lambda x: lax.psum(_scaled(x), ax)
  return sm(f, mesh, in_specs=P(ax), out_specs=P()), (arr(8),)


@case()
def pure_callback_inside(sm, mesh):
  ax = first(mesh)
  def f(x):
    shape = jax.ShapeDtypeStruct(x.shape, x.dtype)
    return jax.pure_callback(lambda v: np.asarray(v) * 2, shape, x)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


@case()
def linear_solve_inside(sm, mesh):
  ax = first(mesh)
  def f(b):
    a = jnp.eye(2) * 3 + 1
    return jax.scipy.sparse.linalg.cg(lambda v: a @ v, b[0])[0][None]
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(mesh.shape[ax], 2),)


@case()
def custom_linear_solve_inside(sm, mesh):
  ax = first(mesh)
  def f(b):
    mv = lambda v: v * 4.0
    solve = lambda _, v: v / 4.0
    return lax.custom_linear_solve(mv, b, solve)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


@case()
def device_put_no_device(sm, mesh):
  ax = first(mesh)
  f = lambda x: jax.device_put(x) + 1
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


@case()
def device_put_explicit_device(sm, mesh):
  ax = first(mesh)
  f = lambda x: jax.device_put(x, jax.devices()[0]) + 1
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


@case()
def check_rep_false_psum(sm, mesh):
  ax = first(mesh)
  f = lambda x: lax.psum(x, ax)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(), check_rep=False), (arr(8),)


@case()
def check_rep_false_varying_out(sm, mesh):
  ax = every(mesh)
  f = lambda x: x * 2  # not replicated, but check is off
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax), check_rep=False), (arr(16),)


@case()
def optimization_barrier_inside(sm, mesh):
  ax = first(mesh)
  f = lambda x: lax.optimization_barrier(x * 2) + 1
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


@case()
def reduce_precision_and_casts(sm, mesh):
  ax = first(mesh)
  f = lambda x: lax.reduce_precision(x, 5, 10).astype(jnp.int32).astype(jnp.float16)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8),)


@case()
def gather_scatter_inside(sm, mesh):
  ax = first(mesh)
  def f(x, idx):
    return x.at[idx % x.shape[0]].add(1.0)[idx % x.shape[0]]
  return sm(f, mesh, in_specs=(P(ax), P(ax)), out_specs=P(ax)), (
      arr(16), np.arange(16, dtype=np.int32))


@case()
def conv_inside(sm, mesh):
  ax = first(mesh)
  def f(x, k):
    return lax.conv_general_dilated(x, k, (1,), "SAME")
  return sm(f, mesh, in_specs=(P(ax), P()), out_specs=P(ax)), (arr(8, 1, 6), arr(2, 1, 3))


@case()
def fft_inside(sm, mesh):
  ax = first(mesh)
  f = lambda x: jnp.fft.fft(x).real
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8, 4),)


@case()
def linalg_inside(sm, mesh):
  ax = first(mesh)
  def f(x):
    m = x.reshape(-1, 2, 2) + 3 * jnp.eye(2)
    return jnp.linalg.det(m)
  return sm(f, mesh, in_specs=P(ax), out_specs=P(ax)), (arr(8, 4),)


# --- partial auto and nesting (jit only: JAX's eager path rejects auto) ----------------

@case(meshes=((4, 2), (2, 2, 2)), eager=False)
def partial_auto_elementwise(sm, mesh):
  a, rest = mesh.axis_names[0], frozenset(mesh.axis_names[1:])
  return sm(lambda x: x * 2 + 1, mesh, in_specs=P(a), out_specs=P(a), auto=rest), (arr(8, 4),)


@case(meshes=((4, 2), (2, 2, 2)), eager=False)
def partial_auto_psum(sm, mesh):
  a, rest = mesh.axis_names[0], frozenset(mesh.axis_names[1:])
  return sm(lambda x: lax.psum(x, a), mesh, in_specs=P(a), out_specs=P(), auto=rest), (arr(8, 4),)


@case(meshes=((4, 2), (2, 2, 2)))
def partial_auto_eager(sm, mesh):
  # Eagerly, JAX 0.6 rejects a partially manual shard_map and 0.10 runs it.
  a, rest = mesh.axis_names[0], frozenset(mesh.axis_names[1:])
  return sm(lambda x: x + 1, mesh, in_specs=P(a), out_specs=P(a), auto=rest), (arr(8),)


@case(meshes=((2, 2, 2),), eager=False)
def partial_auto_one_axis(sm, mesh):
  f = lambda x: lax.psum(x, "y") * lax.axis_index("x")
  return sm(f, mesh, in_specs=P("x", "y"), out_specs=P("x"), auto=frozenset({"z"})), (arr(4, 4),)


@case(meshes=((4, 2), (2, 2, 2)), needs_vma=True)
def nested_shard_map_other_axis(sm, mesh):
  a, b = mesh.axis_names[:2]
  others = frozenset(n for n in mesh.axis_names if n != a)
  def inner(x):
    # 0.10 requires the inner mesh to be the (partly manual) context mesh.
    inner_mesh = mesh if not has("core_shard_map") else jax.sharding.get_abstract_mesh()
    return sm(lambda v: lax.psum(v, b), inner_mesh, in_specs=P(None, b), out_specs=P())(x)
  outer = sm(inner, mesh, in_specs=P(a), out_specs=P(a), auto=others)
  return outer, (arr(8, 4),)


# --- errors raised from inside the body ---------------------------------------------------

@case()
def unbound_axis_name(sm, mesh):
  f = lambda x: lax.psum(x, "nonexistent")
  return sm(f, mesh, in_specs=P(first(mesh)), out_specs=P()), (arr(8),)


@case()
def replication_error_missing_psum(sm, mesh):
  f = lambda x: x * 2
  return sm(f, mesh, in_specs=P(first(mesh)), out_specs=P()), (arr(8),)


@case()
def replication_after_all_gather(sm, mesh):
  ax = first(mesh)
  f = lambda x: lax.all_gather(x, ax)
  return sm(f, mesh, in_specs=P(ax), out_specs=P()), (arr(8),)


@case()
def replicated_in_replicated_out(sm, mesh):
  f = lambda x: x * 2
  return sm(f, mesh, in_specs=P(), out_specs=P()), (arr(4),)


@case()
def out_rank_too_small(sm, mesh):
  f = lambda x: x.sum()
  return sm(f, mesh, in_specs=P(first(mesh)), out_specs=P(first(mesh))), (arr(8),)


def run_case(c: Case, sm, mesh, mode: str):
  """Outcome of one case: ('ok', outputs) or ('err', exception)."""
  try:
    fun, args = c.build(sm, mesh)
    if mode == "jit":
      fun = jax.jit(fun)
    out = jax.block_until_ready(fun(*args))
  except Exception as e:  # noqa: BLE001 - differential: compare exception types
    return "err", e
  return "ok", out
