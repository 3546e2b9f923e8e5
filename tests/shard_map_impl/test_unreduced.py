"""Unreduced/reduced axes in specs (partial-sum types), differentially against the
running release's ``jax.shard_map``.

Where JAX rejects such specs (partially manual, axes not Explicit, a spec that
disagrees with its value) ours raises the same exception with the same message.
Where JAX accepts them (fully manual over Explicit axes) each program is run by
both under jit (Shardy and GSPMD) and eagerly, and everything observable must
agree: values bit for bit, output avals and shardings, the printed jaxpr and
the lowered StableHLO -- or, where JAX fails, the same error.  The programs are
the ones JAX's own ``test_unreduced_*`` / ``test_reduced_*`` cases exercise:
partial sums leaving a body and resharded outside, ``psum``/``psum_scatter`` of
an unreduced input, reduced inputs differentiated (their cotangents are
unreduced: the transpose swaps the two), nested jit, explicit ``pcast``s, and
the transformations (jvp, linearize, vmap, remat, DCE).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

import jax
import numpy as np
import pytest
from jax._src import config, core
from jax._src.interpreters import partial_eval as pe
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import shard_map_impl
from shard_map_impl.jax_line import AVALS_HAVE_MANUAL_AXIS_TYPE, EAGER_PARTIAL_SUMS_REFUSAL
from differential import assert_same_observations, observe
from reference import outcomes_or_same_error
from support.jax_lines import requires

pytestmark = [
    requires("partial_sum_specs"),
    # Where partial sums sit in avals' shardings and JAX's eager shard_map neither runs
    # nor refuses them (0.8.0-0.9.0), JAX's own suite (tests/conformance) is the check:
    # these programs' eager runs fail in JAX (its own out_specs check) and in ours with
    # other errors, and their grads' printed jaxprs differ from JAX's.
    pytest.mark.skipif(not AVALS_HAVE_MANUAL_AXIS_TYPE and not EAGER_PARTIAL_SUMS_REFUSAL,
                       reason="partial sums in shardings without JAX's eager refusal: "
                              "JAX's own shard_map suite checks ours on this release"),
]

lax = jax.lax
X = np.arange(32.0, dtype=np.float32).reshape(8, 4)
W = np.arange(16.0, dtype=np.float32).reshape(4, 4) / 7


def _mesh(*types: AxisType) -> jax.sharding.Mesh:
  return jax.make_mesh((4, 2), ("x", "y"), axis_types=types)


EXPLICIT = (AxisType.Explicit, AxisType.Explicit)
AUTO = (AxisType.Auto, AxisType.Auto)
MIXED = (AxisType.Explicit, AxisType.Auto)

# --- where JAX rejects the specs ----------------------------------------------

def _rejected() -> dict[str, tuple]:
  """(axis types, axis_names, in_specs, out_specs): each one JAX rejects.  Built per
  test: jax 0.6's PartitionSpec (the module is collected there too) has no such axes."""
  return {
      "out_unreduced_partial_manual": (EXPLICIT, {"x"}, P("x"), P(None, unreduced={"x"})),
      "in_reduced_partial_manual": (EXPLICIT, {"y"}, P(None, reduced={"y"}), P()),
      "out_unreduced_auto_axis": (AUTO, frozenset(), P("x"), P(unreduced={"y"})),
      "out_reduced_auto_axis": (AUTO, frozenset(), P("x"), P(reduced={"x"})),
      "in_unreduced_auto_axis": (AUTO, frozenset(), P(unreduced={"x"}), P()),
      "unreduced_on_the_auto_axis_of_a_mixed_mesh": (MIXED, frozenset(), P("x"),
                                                     P(unreduced={"y"})),
      "reduced_checked_after_unreduced": (MIXED, frozenset(), P("x"),
                                          P(unreduced={"x"}, reduced={"y"})),
      "in_specs_checked_before_out_specs": (AUTO, frozenset(), P(reduced={"x"}),
                                            P(unreduced={"y"})),
      "bad_leaf_reported_before_unreduced": (AUTO, frozenset(), (P("x"), 3),
                                             P(unreduced={"y"})),
  }


def _raised(sm: Callable, types: tuple, axis_names: Any, in_specs: Any, out_specs: Any
            ) -> BaseException:
  mesh = _mesh(*types)
  args = (X, X) if isinstance(in_specs, tuple) else (X,)
  try:
    jax.jit(sm(lambda *a: a[0], mesh=mesh, in_specs=in_specs, out_specs=out_specs,
               axis_names=axis_names))(*args)
  except Exception as e:  # noqa: BLE001  (the comparison is the test)
    return e
  raise AssertionError(f"{sm} accepted {in_specs} -> {out_specs}")


CASE_NAMES = ("out_unreduced_partial_manual", "in_reduced_partial_manual",
              "out_unreduced_auto_axis", "out_reduced_auto_axis", "in_unreduced_auto_axis",
              "unreduced_on_the_auto_axis_of_a_mixed_mesh", "reduced_checked_after_unreduced",
              "in_specs_checked_before_out_specs", "bad_leaf_reported_before_unreduced")


@pytest.mark.parametrize("case", CASE_NAMES)
def test_rejection_agrees_with_jax(case):
  program = _rejected()[case]
  want = _raised(jax.shard_map, *program)
  got = _raised(shard_map_impl.shard_map, *program)
  assert type(got) is type(want)
  assert str(got) == str(want)


# --- where JAX accepts them: programs run by both -------------------------------

Program = Callable[[Callable, jax.sharding.Mesh], tuple[Callable, tuple]]


def _put(mesh: jax.sharding.Mesh, a: np.ndarray, spec: P) -> jax.Array:
  return jax.device_put(a, NamedSharding(mesh, spec))


def _partial_matmul(sm: Callable, mesh: jax.sharding.Mesh) -> Callable:
  """x @ w contracted over the devices' x blocks: an unreduced partial sum over x."""
  return sm(lambda a, b: a @ b, mesh=mesh, in_specs=(P(None, "x"), P("x", None)),
            out_specs=P(unreduced={"x"}))


def _matmul_args(mesh: jax.sharding.Mesh) -> tuple:
  return _put(mesh, X, P(None, "x")), _put(mesh, W, P("x", None))


def _reduced_weight_matmul(sm: Callable, mesh: jax.sharding.Mesh) -> Callable:
  """Rows of x times a weight passed reduced over x (its cotangent is unreduced)."""
  return sm(lambda w, x: x @ w, mesh=mesh, in_specs=(P(reduced={"x"}), P("x")),
            out_specs=P("x"))


def _local_sum(sm: Callable, mesh: jax.sharding.Mesh, body: Callable | None = None,
               **kw: Any) -> Callable:
  return sm(body or (lambda a: a.sum(0, keepdims=True)), mesh=mesh, in_specs=P("x", None),
            out_specs=P(None, None, unreduced={"x"}), **kw)


def _out_unreduced_resharded(sm, mesh):
  f = _local_sum(sm, mesh)
  return (lambda a: jax.reshard(f(a), P())), (_put(mesh, X, P("x", None)),)


def _out_unreduced_returned(sm, mesh):
  return _local_sum(sm, mesh), (_put(mesh, X, P("x", None)),)


def _matmul_unreduced_resharded(sm, mesh):
  f = _partial_matmul(sm, mesh)
  return (lambda a, b: jax.reshard(f(a, b), P())), _matmul_args(mesh)


def _psum_of_unreduced_input(sm, mesh):
  f = _partial_matmul(sm, mesh)
  g = sm(lambda c: lax.psum(c, "x"), mesh=mesh, in_specs=P(unreduced={"x"}), out_specs=P())
  return (lambda a, b: g(f(a, b))), _matmul_args(mesh)


def _psum_scatter_of_unreduced_input(sm, mesh):
  f = _partial_matmul(sm, mesh)
  g = sm(lambda c: lax.psum_scatter(c, "x", tiled=True), mesh=mesh,
         in_specs=P(unreduced={"x"}), out_specs=P("x"))
  return (lambda a, b: g(f(a, b))), _matmul_args(mesh)


def _unreduced_input_inferred(sm, mesh):
  f = _partial_matmul(sm, mesh)
  g = sm(lambda c: lax.psum(c, "x"), mesh=mesh, out_specs=P())  # in_specs from c's type
  return (lambda a, b: g(f(a, b))), _matmul_args(mesh)


def _reduced_input(sm, mesh):
  f = _reduced_weight_matmul(sm, mesh)
  return (lambda w, x: f(jax.reshard(w, P(reduced={"x"})), x)), (_put(mesh, W, P()),
                                                                 _put(mesh, X, P("x")))


def _grad_of_reduced_input(sm, mesh):
  f = _reduced_weight_matmul(sm, mesh)
  loss = lambda w, x: f(jax.reshard(w, P(reduced={"x"})), x).sum()
  return jax.grad(loss), (_put(mesh, W, P()), _put(mesh, X, P("x")))


def _remat_grad_of_reduced_input(sm, mesh):
  f = _reduced_weight_matmul(sm, mesh)
  loss = jax.checkpoint(lambda w, x: f(jax.reshard(w, P(reduced={"x"})), x).sum())
  return jax.grad(loss), (_put(mesh, W, P()), _put(mesh, X, P("x")))


def _grad_of_unreduced_output(sm, mesh):
  f = _partial_matmul(sm, mesh)
  return (jax.grad(lambda a, b: jax.reshard(f(a, b), P()).sum(), argnums=(0, 1)),
          _matmul_args(mesh))


def _grad_through_psum_of_unreduced(sm, mesh):
  f = _partial_matmul(sm, mesh)
  g = sm(lambda c: lax.psum(c, "x") * 2, mesh=mesh, in_specs=P(unreduced={"x"}),
         out_specs=P())
  return jax.grad(lambda a, b: g(f(a, b)).sum(), argnums=(0, 1)), _matmul_args(mesh)


def _jvp_of_unreduced_output(sm, mesh):
  f = _partial_matmul(sm, mesh)
  h = lambda a, b: jax.reshard(f(a, b), P())
  args = _matmul_args(mesh)
  return (lambda a, b: jax.jvp(h, (a, b), (a, b))), args


def _linearize_reduced_input(sm, mesh):
  f = _reduced_weight_matmul(sm, mesh)
  h = lambda w, x: f(jax.reshard(w, P(reduced={"x"})), x)
  def run(w, x):
    out, lin = jax.linearize(h, w, x)
    return out, lin(w, x)
  return run, (_put(mesh, W, P()), _put(mesh, X, P("x")))


def _nested_jit_body(sm, mesh):
  f = _local_sum(sm, mesh, jax.jit(lambda a: a.sum(0, keepdims=True)))
  return (lambda a: jax.reshard(f(a), P())), (_put(mesh, X, P("x", None)),)


def _explicit_pcast_to_unreduced(sm, mesh):
  f = _local_sum(sm, mesh, lambda a: lax.pcast(a.sum(0, keepdims=True), "x", to="unreduced"))
  return (lambda a: jax.reshard(f(a), P())), (_put(mesh, X, P("x", None)),)


def _reduced_output(sm, mesh):
  f = sm(lambda w: lax.pcast(w, "x", to="reduced"), mesh=mesh, in_specs=P(),
         out_specs=P(reduced={"x"}))
  return (lambda w: jax.reshard(f(w), P())), (_put(mesh, W, P()),)


def _unchecked_unreduced_output(sm, mesh):
  f = _local_sum(sm, mesh, check_vma=False)
  return (lambda a: jax.reshard(f(a), P())), (_put(mesh, X, P("x", None)),)


def _vmap_of_unreduced_output(sm, mesh):
  f = _local_sum(sm, mesh)
  return (jax.vmap(lambda a: jax.reshard(f(a), P()), in_axes=2),
          (_put(mesh, X.reshape(8, 2, 2), P("x", None)),))


def _out_spec_without_the_partial_sum(sm, mesh):
  f = sm(lambda a: lax.pcast(a.sum(0, keepdims=True), "x", to="unreduced"), mesh=mesh,
         in_specs=P("x", None), out_specs=P(None, None))
  return f, (_put(mesh, X, P("x", None)),)


def _in_spec_not_the_inputs(sm, mesh):
  f = sm(lambda a: a, mesh=mesh, in_specs=P(unreduced={"x"}), out_specs=P(unreduced={"x"}))
  return f, (_put(mesh, X, P()),)


def _reduced_times_varying(sm, mesh):
  """A reduced weight used with a varying value: the cast to varying is implicit."""
  f = sm(lambda w, x: x * w[0], mesh=mesh, in_specs=(P(reduced={"x"}), P("x")),
         out_specs=P("x"))
  loss = lambda w, x: f(jax.reshard(w, P(reduced={"x"})), x).sum()
  return jax.value_and_grad(loss), (_put(mesh, W, P()), _put(mesh, X, P("x")))


def _unreduced_and_reduced_in_one_spec(sm, mesh):
  """Unreduced over x and reduced over y at once, resharded outside."""
  f = sm(lambda a: lax.pcast(lax.pcast(a.sum(0, keepdims=True), "x", to="unreduced"), "y",
                             to="reduced"),
         mesh=mesh, in_specs=P("x"), out_specs=P(None, None, unreduced={"x"}, reduced={"y"}))
  return (lambda a: jax.reshard(f(a), P())), (_put(mesh, X, P("x")),)


def _unreduced_sharded_over_y(sm, mesh):
  """A partial sum over x whose columns are split over y."""
  f = sm(lambda a, b: a @ b, mesh=mesh, in_specs=(P(None, "x"), P("x", "y")),
         out_specs=P(None, "y", unreduced={"x"}))
  g = sm(lambda c: lax.psum(c, "x"), mesh=mesh, in_specs=P(None, "y", unreduced={"x"}),
         out_specs=P(None, "y"))
  return (lambda a, b: g(f(a, b))), (_put(mesh, X, P(None, "x")), _put(mesh, W, P("x", "y")))


def _scan_over_unreduced_carry(sm, mesh):
  """Partial sums accumulated in a scan carry, summed at the end."""
  def body(a):
    init = lax.pcast(jax.numpy.zeros((4,), a.dtype), "x", to="varying")
    total, _ = lax.scan(lambda c, r: (c + r, None), init, a)
    return lax.psum(lax.pcast(total, "x", to="unreduced"), "x")
  f = sm(body, mesh=mesh, in_specs=P("x"), out_specs=P())
  return jax.grad(lambda a: f(a).sum()), (_put(mesh, X, P("x")),)


def _remat_inside_body(sm, mesh):
  f = sm(jax.checkpoint(lambda w, x: jax.numpy.sin(x @ w)), mesh=mesh,
         in_specs=(P(reduced={"x"}), P("x")), out_specs=P("x"))
  loss = lambda w, x: f(jax.reshard(w, P(reduced={"x"})), x).sum()
  return jax.grad(loss), (_put(mesh, W, P()), _put(mesh, X, P("x")))


def _reduced_input_unchecked(sm, mesh):
  f = sm(lambda w, x: x @ w, mesh=mesh, in_specs=(P(reduced={"x"}), P("x")),
         out_specs=P("x"), check_vma=False)
  return (lambda w, x: f(jax.reshard(w, P(reduced={"x"})), x)), (_put(mesh, W, P()),
                                                                 _put(mesh, X, P("x")))


def _jvp_of_reduced_input(sm, mesh):
  f = _reduced_weight_matmul(sm, mesh)
  h = lambda w, x: f(jax.reshard(w, P(reduced={"x"})), x)
  return (lambda w, x: jax.jvp(h, (w, x), (w * 3, x))), (_put(mesh, W, P()),
                                                         _put(mesh, X, P("x")))


def _vjp_of_unreduced_input(sm, mesh):
  """The cotangent of an unreduced input is reduced."""
  g = sm(lambda c: lax.psum(c, "x") * 2, mesh=mesh, in_specs=P(unreduced={"x"}),
         out_specs=P())
  f = _partial_matmul(sm, mesh)
  def run(a, b):
    out, pullback = jax.vjp(g, f(a, b))
    return out, jax.reshard(pullback(out)[0], P())
  return run, _matmul_args(mesh)


def _all_gather_to_reduced_grad(sm, mesh):
  """FSDP: weights gathered as a reduced value; their cotangent is an unreduced partial
  sum, psum-scattered back to the weights' shards by the transpose."""
  def body(w, x):
    return x @ lax.all_gather(w, "x", tiled=True, to="reduced")
  f = sm(body, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x"))
  return jax.value_and_grad(lambda w, x: f(w, x).sum()), (_put(mesh, W, P("x")),
                                                          _put(mesh, X, P("x")))


def _vmap_over_reduced_input(sm, mesh):
  """vmap of a shard_map whose input is reduced: the batched spec keeps the partial sum."""
  f = sm(lambda w, x: x @ w, mesh=mesh, in_specs=(P(reduced={"x"}), P("x")),
         out_specs=P("x"))
  ws = np.stack([W, W * 2])
  def run(ws, x):
    return jax.vmap(f, in_axes=(0, None))(jax.reshard(ws, P(reduced={"x"})), x)
  return run, (_put(mesh, ws, P()), _put(mesh, X, P("x")))


def _vmap_beside_a_reduced_input(sm, mesh):
  """vmap over the varying input only: the reduced one enters every instance as is."""
  f = sm(lambda w, x: x @ w, mesh=mesh, in_specs=(P(reduced={"x"}), P("x")),
         out_specs=P("x"))
  xs = np.stack([X, X + 1])
  def run(w, xs):
    return jax.vmap(f, in_axes=(None, 0))(jax.reshard(w, P(reduced={"x"})), xs)
  return run, (_put(mesh, W, P()), _put(mesh, xs, P(None, "x")))


def _vmap_of_psum_of_unreduced(sm, mesh):
  g = sm(lambda c: lax.psum(c, "x"), mesh=mesh, in_specs=P(unreduced={"x"}), out_specs=P())
  f = _partial_matmul(sm, mesh)
  return (lambda a, b: jax.vmap(g)(f(a, b))), _matmul_args(mesh)


def _in_spec_not_the_inputs_sharding(sm, mesh):
  """Fully manual over Explicit axes nothing is resharded on the way in."""
  f = sm(lambda a: a * 2, mesh=mesh, in_specs=P("x"), out_specs=P("x"))
  return f, (_put(mesh, X, P()),)


PROGRAMS: dict[str, Program] = {
    "out_unreduced_resharded": _out_unreduced_resharded,
    "out_unreduced_returned": _out_unreduced_returned,
    "matmul_unreduced_resharded": _matmul_unreduced_resharded,
    "psum_of_unreduced_input": _psum_of_unreduced_input,
    "psum_scatter_of_unreduced_input": _psum_scatter_of_unreduced_input,
    "unreduced_input_inferred": _unreduced_input_inferred,
    "reduced_input": _reduced_input,
    "grad_of_reduced_input": _grad_of_reduced_input,
    "remat_grad_of_reduced_input": _remat_grad_of_reduced_input,
    "grad_of_unreduced_output": _grad_of_unreduced_output,
    "grad_through_psum_of_unreduced": _grad_through_psum_of_unreduced,
    "jvp_of_unreduced_output": _jvp_of_unreduced_output,
    "linearize_reduced_input": _linearize_reduced_input,
    "nested_jit_body": _nested_jit_body,
    "explicit_pcast_to_unreduced": _explicit_pcast_to_unreduced,
    "reduced_output": _reduced_output,
    "unchecked_unreduced_output": _unchecked_unreduced_output,
    "vmap_of_unreduced_output": _vmap_of_unreduced_output,
    "out_spec_without_the_partial_sum": _out_spec_without_the_partial_sum,
    "in_spec_not_the_inputs": _in_spec_not_the_inputs,
    "in_spec_not_the_inputs_sharding": _in_spec_not_the_inputs_sharding,
    "reduced_times_varying": _reduced_times_varying,
    "unreduced_and_reduced_in_one_spec": _unreduced_and_reduced_in_one_spec,
    "unreduced_sharded_over_y": _unreduced_sharded_over_y,
    "scan_over_unreduced_carry": _scan_over_unreduced_carry,
    "remat_inside_body": _remat_inside_body,
    "reduced_input_unchecked": _reduced_input_unchecked,
    "jvp_of_reduced_input": _jvp_of_reduced_input,
    "vjp_of_unreduced_input": _vjp_of_unreduced_input,
    "all_gather_to_reduced_grad": _all_gather_to_reduced_grad,
    "vmap_over_reduced_input": _vmap_over_reduced_input,
    "vmap_of_psum_of_unreduced": _vmap_of_psum_of_unreduced,
    "vmap_beside_a_reduced_input": _vmap_beside_a_reduced_input,
}


def _observe(name: str, sm: Callable, mode: str) -> dict[str, Any]:
  mesh = _mesh(*EXPLICIT)
  with config.use_shardy_partitioner(mode != "gspmd"), jax.set_mesh(mesh):
    return observe(lambda: PROGRAMS[name](sm, mesh), jit=mode != "eager")


@pytest.mark.parametrize("mode", ["shardy", "gspmd", "eager"])
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_agrees_with_jax(name, mode):
  if (name, mode) == ("all_gather_to_reduced_grad", "eager") and EAGER_PARTIAL_SUMS_REFUSAL:
    pytest.xfail("both raise, not the same error: this JAX stages the primal half of an "
                 "eager linearize and fails its own out_specs check on the reduced residual "
                 "(its residual spec drops the partial sum); ours runs that half eagerly and "
                 "reaches JAX's eager refusal of partial sums first")
  want = _observe(name, jax.shard_map, mode)
  got = _observe(name, shard_map_impl.shard_map, mode)
  assert_same_observations(want, got, eager=mode == "eager")


# Programs JAX refuses to trace (the differential test above compares the errors).
REFUSED_BY_JAX = {"vmap_of_unreduced_output", "vmap_over_reduced_input",
                  "vmap_of_psum_of_unreduced", "in_spec_not_the_inputs",
                  "in_spec_not_the_inputs_sharding", "out_spec_without_the_partial_sum"}


@pytest.mark.parametrize("name", [n for n in PROGRAMS if n not in REFUSED_BY_JAX])
def test_staged_program_typechecks(name):
  """core.check_jaxpr accepts our equations (partial sums in binders and specs), where
  JAX's own shard_map traces the program (where it does not, e.g. JAX 0.10.0 on the
  gradient of a reduced input cast to varying, ours must fail the same way)."""
  mesh = _mesh(*EXPLICIT)

  def staged(sm: Callable) -> core.ClosedJaxpr:
    fn, args = PROGRAMS[name](sm, mesh)
    return jax.make_jaxpr(fn)(*args)
  with jax.set_mesh(mesh):
    closed = outcomes_or_same_error({"jax": jax.shard_map, "ours": shard_map_impl.shard_map},
                                    staged)
  if closed is not None:
    core.check_jaxpr(closed["ours"].jaxpr)


def test_dce_keeps_the_partial_sum_specs():
  """Dropping an unused output keeps the other outputs' unreduced specs (as JAX's DCE)."""
  mesh = _mesh(*EXPLICIT)
  texts = {}
  for label, sm in (("jax", jax.shard_map), ("ours", shard_map_impl.shard_map)):
    f = sm(lambda a, b: (a @ b, (a @ b) * 2), mesh=mesh, in_specs=(P(None, "x"), P("x", None)),
           out_specs=(P(unreduced={"x"}), P(unreduced={"x"})))
    with jax.set_mesh(mesh):
      closed = jax.make_jaxpr(f)(*_matmul_args(mesh))
    pruned, used_inputs = pe.dce_jaxpr(closed.jaxpr, [False, True])
    texts[label] = (str(pruned), used_inputs)
  assert texts["ours"] == texts["jax"]


@pytest.mark.parametrize("side", ["in", "out"])
def test_typecheck_rejects_specs_that_drop_the_partial_sum(side):
  """An equation whose spec disagrees with its operand's/result's partial sum fails
  core.check_jaxpr as JAX's own equation does: an operand with JAX's error, a result
  with the same exception type (ours says which output and what it was inferred)."""
  mesh = _mesh(*EXPLICIT)
  raised = []
  for sm in (jax.shard_map, shard_map_impl.shard_map):
    with jax.set_mesh(mesh):
      f = _partial_matmul(sm, mesh)
      g = sm(lambda c: lax.psum(c, "x"), mesh=mesh, in_specs=P(unreduced={"x"}), out_specs=P())
      # The unreduced input made under jit: some releases refuse partial sums eagerly.
      closed = jax.make_jaxpr(f if side == "out" else g)(
          *(_matmul_args(mesh) if side == "out" else (jax.jit(f)(*_matmul_args(mesh)),)))
      eqn, = closed.jaxpr.eqns
      key = f"{side}_specs"
      bad = eqn.replace(params=dict(eqn.params, **{key: (P(),)}))
      with pytest.raises(Exception) as info:
        core.check_jaxpr(closed.jaxpr.replace(eqns=[bad]))
    raised.append((type(info.value), str(info.value)))
  (want_type, want), (got_type, got) = raised
  assert got_type is want_type
  if got != want:  # a result's, where avals type manual sums: ours says which output
    assert side == "out" and "shard_map output 0 is not provably replicated as out_names" in got
