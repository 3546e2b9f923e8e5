"""Conformance: the array and wrapper surface of pmap_compat vs legacy jax.pmap.

Outputs (indexing, slicing, iteration, shards, sharding kind, replication, device_get,
np.asarray, reuse as inputs, block_until_ready), AOT lower/compile, make_jaxpr, retracing
on new shapes, debug prints/callbacks, pickling, and error cases with their messages.
"""
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from pmap_compat import pmap
from support.compare import compare_call, compare_with_jax_pmap, compare_with_legacy, run_program
from support.jax_lines import requires
import line_helpers


def arr(*shape, dtype=np.float32):
  return (np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) * 0.5 - 1).astype(dtype)


def _out(pm, n=8):
  return pm(lambda x: x * 2 + 1)(arr(n, 3))


OUTPUT_VIEWS = {
    "index0": lambda o: o[0],
    "index_neg": lambda o: o[-1],
    "slice": lambda o: o[1:3],
    "slice_step": lambda o: o[::3],
    "fancy": lambda o: o[np.array([3, 0])],
    "row_col": lambda o: o[2, 1],
    "list": lambda o: list(o),
    "iter_sum": lambda o: sum(r.sum() for r in o),
    "len": lambda o: len(o),
    "np_asarray": lambda o: np.asarray(o),
    "device_get": lambda o: jax.device_get(o),
    "tolist": lambda o: o.tolist(),
    "shape_dtype": lambda o: (o.shape, str(o.dtype), o.ndim, o.size),
    "sharding_kind": lambda o: type(o.sharding).__name__,
    "fully_replicated": lambda o: o.is_fully_replicated,
    "fully_addressable": lambda o: o.is_fully_addressable,
    "n_shards": lambda o: len(o.addressable_shards),
    "shard_shapes": lambda o: [s.data.shape for s in o.addressable_shards],
    "shard_indices": lambda o: [str(s.index) for s in o.addressable_shards],
    "shard_devices": lambda o: [s.device.id for s in o.addressable_shards],
    "shard_data": lambda o: [s.data for s in o.addressable_shards],
    "devices_set": lambda o: sorted(d.id for d in o.devices()),
    "reduction": lambda o: o.sum(axis=0),
    "jnp_op": lambda o: jnp.mean(o, axis=1),
    "jit_consumer": lambda o: jax.jit(lambda v: v * 2)(o),
    "astype_np": lambda o: np.asarray(o).astype(np.int32),
    "float_of_elem": lambda o: float(o[1, 2]),
    "block_until_ready": lambda o: jax.block_until_ready(o),
    "copy": lambda o: o.copy(),
    "repr_prefix": lambda o: repr(o)[:6],
}


# Views that show the sharding's class: legacy's PmapSharding exists on jax 0.6 only.
SHARDING_VIEWS = {"sharding_kind"}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=requires("pmap_sharding", "legacy's PmapSharding"))
    if n in SHARDING_VIEWS else n for n in sorted(OUTPUT_VIEWS)])
def test_output_view(name):
  compare_with_legacy(lambda pm: OUTPUT_VIEWS[name](_out(pm)), pmap)


def test_output_of_smaller_mapped_size_shards():
  compare_with_legacy(lambda pm: ([s.device.id for s in _out(pm, 3).addressable_shards],
                                  _out(pm, 3)[2]), pmap)


def _replicated_output_kind(pm):
  o = pm(lambda x: x.sum(), out_axes=None)(arr(8, 2))
  return o, type(o.sharding).__name__, o.is_fully_replicated


@requires("pmap_sharding", "legacy's PmapSharding")
def test_replicated_output_sharding_kind():
  compare_with_legacy(_replicated_output_kind, pmap)


@requires("no_legacy_pmap", "the release's jax.pmap is the reference for its output shardings")
@pytest.mark.parametrize("program", [
    lambda pm: [OUTPUT_VIEWS[n](_out(pm)) for n in sorted(SHARDING_VIEWS)],
    _replicated_output_kind], ids=["views", "replicated"])
def test_output_sharding_kind_is_jax_pmaps(program):
  assert compare_with_jax_pmap(program, pmap).error is None


def test_reusing_outputs_as_inputs_chain():
  def program(pm):
    f = pm(lambda x: lax.psum(x, "i") / 8 + 1, axis_name="i")
    y = f(arr(8, 3))
    for _ in range(3):
      y = f(y)
    return y
  compare_with_legacy(program, pmap)


def test_outputs_of_one_pmap_feed_another_with_different_in_axes():
  def program(pm):
    y = pm(lambda x: x * 2, out_axes=1)(arr(8, 3))
    return pm(lambda z: z + 1, in_axes=1)(y)
  compare_with_legacy(program, pmap)


def test_device_put_replicated_and_sharded_inputs():
  devs = jax.devices()
  def program(pm):
    r = line_helpers.device_put_replicated(arr(3), devs)
    s = line_helpers.device_put_sharded([arr(3) + i for i in range(8)], devs)
    return pm(lambda a, b: a * b)(r, s)
  compare_with_legacy(program, pmap)


def test_block_until_ready_on_tree():
  compare_with_legacy(lambda pm: jax.block_until_ready(
      pm(lambda x: {"a": x, "b": (x * 2,)})(arr(8, 2))), pmap)


def test_lower_compile_call():
  def program(pm):
    f = pm(lambda x, y: (x + y, lax.psum(x, "i")), axis_name="i")
    return f.lower(arr(8, 2), arr(8, 2)).compile()(arr(8, 2), arr(8, 2))
  compare_with_legacy(program, pmap)


def test_lower_as_text_is_string():
  def program(pm):
    t = pm(lambda x: x + 1).lower(arr(8, 2)).as_text()
    return isinstance(t, str) and len(t) > 0
  compare_with_legacy(program, pmap)


def test_lower_with_shape_dtype_struct():
  def program(pm):
    f = pm(lambda x: x * 3)
    c = f.lower(jax.ShapeDtypeStruct((8, 2), jnp.float32)).compile()
    return c(arr(8, 2))
  compare_with_legacy(program, pmap)


def test_compiled_rejects_wrong_shape():
  def program(pm):
    c = pm(lambda x: x * 3).lower(arr(8, 2)).compile()
    return c(arr(8, 3))
  compare_with_legacy(program, pmap)


def test_make_jaxpr_of_pmap_runs():
  def program(pm):
    j = jax.make_jaxpr(pm(lambda x: lax.psum(x, "i"), axis_name="i"))(arr(8, 2))
    return [tuple(v.aval.shape) for v in j.jaxpr.outvars], jax.core.eval_jaxpr(j.jaxpr, j.consts, arr(8, 2))
  compare_with_legacy(program, pmap)


def test_eval_shape_of_pmap():
  def program(pm):
    s = jax.eval_shape(pm(lambda x: (x.sum(), x[None])), jax.ShapeDtypeStruct((8, 3), jnp.float32))
    return [(l.shape, str(l.dtype)) for l in jax.tree.leaves(s)]
  compare_with_legacy(program, pmap)


def test_retrace_on_new_shapes_and_dtypes():
  def program(pm):
    f = pm(lambda x: x * 2)
    return f(arr(8, 2)), f(arr(8, 5)), f(arr(4, 2)), f(arr(8, 2, dtype=np.int32)), f(arr(8, 2))
  compare_with_legacy(program, pmap)


def test_cache_size_grows_on_retrace():
  def program(pm):
    f = pm(lambda x: x * 2)
    f(arr(8, 2))
    f(arr(8, 2))
    a = f._cache_size()
    f(arr(8, 3))
    return a, f._cache_size()
  compare_with_legacy(program, pmap)


def test_wrapper_metadata():
  def named_function(x, y=1):
    """doc"""
    return x
  def program(pm):
    f = pm(named_function)
    return f.__name__, f.__doc__, f.__wrapped__ is named_function
  compare_with_legacy(program, pmap)


def test_debug_print_inside(capfd):
  def program(pm):
    def f(x):
      jax.debug.print("value {}", x.sum())
      return x + 1
    out = pm(f)(arr(8, 2))
    jax.effects_barrier()
    return out
  legacy = run_program(program, jax.pmap)
  legacy_lines = sorted(capfd.readouterr().out.splitlines())
  ours = run_program(program, pmap)
  our_lines = sorted(capfd.readouterr().out.splitlines())
  assert legacy.error is None and ours.error is None
  np.testing.assert_array_equal(np.asarray(legacy.value), np.asarray(ours.value))
  assert our_lines == legacy_lines and len(legacy_lines) == 8


def test_debug_callback_inside():
  def program(pm):
    seen = []
    def f(x):
      jax.debug.callback(lambda v: seen.append(float(v)), x.sum())
      return x
    pm(f)(arr(8, 2))
    jax.effects_barrier()
    return sorted(seen)
  compare_with_legacy(program, pmap)


def test_pickle_outputs():
  compare_with_legacy(lambda pm: np.asarray(pickle.loads(pickle.dumps(np.asarray(_out(pm))))), pmap)


def test_pickle_pmapped_function_fails_like_legacy():
  compare_with_legacy(lambda pm: pickle.dumps(pm(lambda x: x)), pmap)


ERRORS = {
    "inconsistent_sizes": (lambda x, y: x + y, (arr(8, 2), arr(4, 2)), {}),
    "too_many_devices": (lambda x: x, (arr(9, 2),), {}),
    "rank0_input": (lambda x: x, (np.float32(1.0),), {}),
    "in_axes_past_rank": (lambda x: x, (arr(8, 2),), {"in_axes": 2}),
    "unbound_axis": (lambda x: lax.psum(x, "nope"), (arr(8, 2),), {"axis_name": "i"}),
    "in_axes_tree_mismatch": (lambda x, y: x, (arr(8), arr(8)), {"in_axes": (0, 0, 0)}),
    "out_axes_past_rank": (lambda x: x, (arr(8, 2),), {"out_axes": 3}),
    "all_in_axes_none": (lambda x: x, (arr(8, 2),), {"in_axes": None}),
    "bad_in_axes_type": (lambda x: x, (arr(8, 2),), {"in_axes": 1.5}),
    "non_array_arg": (lambda x: x, ("text",), {}),
    "out_axes_tree_mismatch": (lambda x: (x, x), (arr(8, 2),), {"out_axes": (0, 0, 0)}),
    "ppermute_bad_perm": (lambda x: lax.ppermute(x, "i", [(0, 1), (1, 1)]), (arr(8, 2),),
                          {"axis_name": "i"}),
    "psum_scatter_bad_dim": (lambda x: lax.psum_scatter(x, "i"), (arr(8, 3),), {"axis_name": "i"}),
    "nonstatic_python_control": (lambda x: x if x.sum() > 0 else -x, (arr(8, 2),), {}),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_error_case(name):
  fun, args, kw = ERRORS[name]
  out = compare_call(fun, args, pmap, **kw)
  assert out.error is not None, f"legacy did not raise for {name}"


def test_error_message_inconsistent_sizes_names_sizes():
  program = lambda pm: pm(lambda x, y: x + y)(arr(8, 2), arr(4, 2))
  legacy = compare_with_legacy(program, pmap)
  ours = run_program(program, pmap)
  assert str(ours.error).splitlines()[0] == str(legacy.error).splitlines()[0]


def test_error_message_too_many_devices():
  program = lambda pm: pm(lambda x: x)(arr(9, 2))
  legacy = compare_with_legacy(program, pmap)
  ours = run_program(program, pmap)
  assert str(ours.error) == str(legacy.error)


def test_not_callable_raises_type_error():
  compare_with_legacy(lambda pm: pm(3), pmap)


def test_global_arg_shapes_rejected():
  compare_with_legacy(lambda pm: pm(lambda x: x, global_arg_shapes=((2,),))(arr(8, 2)), pmap)


_MESH8 = Mesh(np.array(jax.devices()), ("d",))


def _o(pm):
  return pm(lambda x: x * 2)(arr(8, 3))


def _deleted(pm):
  y = _o(pm)
  y.delete()
  return y.is_deleted()
MORE_SURFACE = {
 "nested_lower": lambda pm: pm(pm(lambda x: lax.psum(x, ("i","j")), axis_name="j"), axis_name="i").lower(arr(4,2,3)).compile()(arr(4,2,3)),
 "lower_out_tree": lambda pm: str(pm(lambda x: (x, {"a": x})).lower(arr(8,2)).out_tree),
 "lower_in_tree": lambda pm: str(pm(lambda x, y: x).lower(arr(8,2), y=arr(8,2)).in_tree),
 "compiled_out_tree": lambda pm: str(pm(lambda x: (x, [x])).lower(arr(8,2)).compile().out_tree),
 "kw_for_positional": lambda pm: pm(lambda x, y: x - y)(arr(8,2), y=arr(8,2) * 3),
 "addressable_data": lambda pm: _o(pm).addressable_data(3),
 "jnp_asarray": lambda pm: jnp.asarray(_o(pm)),
 "jnp_array_copy": lambda pm: jnp.array(_o(pm)),
 "delete": _deleted,
 "nbytes": lambda pm: (_o(pm).nbytes, _o(pm).itemsize),
 "committed": lambda pm: _o(pm).committed,
 "global_shards": lambda pm: len(_o(pm).global_shards),
 "device_put_one": lambda pm: jax.device_put(_o(pm), jax.devices()[2]),
 "device_put_named": lambda pm: jax.device_put(_o(pm), NamedSharding(_MESH8, P("d"))),
 "np_array_dtype": lambda pm: np.array(_o(pm), dtype=np.float64),
 "array_iface": lambda pm: _o(pm).__array__().dtype.name,
 "item_of_scalar": lambda pm: pm(lambda x: x.sum())(arr(8,2))[3].item(),
 "bool_of_elem": lambda pm: bool(pm(lambda x: x.sum() > 0)(arr(8,2))[5]),
 "format": lambda pm: f"{_o(pm)[0, 1]:.3f}",
 "eq_op": lambda pm: _o(pm) == _o(pm),
 "matmul_op": lambda pm: _o(pm) @ _o(pm).T,
 "iter_shards_order": lambda pm: [int(s.data[0, 0]) for s in _o(pm).addressable_shards],
 "sharding_devices_indices": lambda pm: [str(v) for v in _o(pm).sharding.devices_indices_map((8, 3)).values()],
 "sharding_shard_shape": lambda pm: _o(pm).sharding.shard_shape((8, 3)),
 "sharding_device_set": lambda pm: sorted(d.id for d in _o(pm).sharding.device_set),
 "sharding_is_fully_repl": lambda pm: _o(pm).sharding.is_fully_replicated,
 "out_none_shards": lambda pm: [s.data.shape for s in pm(lambda x: x.sum(0), out_axes=None)(arr(8,3,2)).addressable_shards],
 "out_axes1_shards": lambda pm: [str(s.index) for s in pm(lambda x: x, out_axes=1)(arr(8,3)).addressable_shards],
 "pytree_out_views": lambda pm: jax.tree.map(lambda v: v[1], pm(lambda x: {"a": x, "b": [x.sum()]})(arr(8,2))),
 "unreplicate_flax": lambda pm: jax.tree.map(lambda v: v[0], pm(lambda x: (x, x * 2), out_axes=0)(line_helpers.device_put_replicated(arr(3), jax.devices()))),
 "reduce_out_none_grad": lambda pm: jax.grad(lambda x: pm(lambda v: lax.psum(v, "i"), axis_name="i", in_axes=0)(x).sum())(arr(8, 2)),
}


@pytest.mark.parametrize("name", sorted(MORE_SURFACE))
def test_more_surface(name):
  compare_with_legacy(MORE_SURFACE[name], pmap)
