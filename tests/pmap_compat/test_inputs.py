"""Row 22: every kind of argument legacy pmap accepts, resharded on device.

Each case builds the same input for legacy ``jax.pmap`` and for ``pmap_compat.pmap``
and compares results. Placement that needs to move data is run under
``jax.transfer_guard_device_to_host("disallow")`` (no host round trip); inputs that
are already where they belong are run under ``jax.transfer_guard("disallow")``
(nothing moves at all).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from pmap_compat import pmap
from support.compare import assert_trees_equal, compare_with_legacy
from support.jax_lines import requires
import line_helpers

N = 8


def data(*shape, dtype=np.float32):
  return (np.arange(int(np.prod(shape))).reshape(shape) % 13 + 1).astype(dtype)


def mesh_of(devices, shape=None, names=("x",)):
  devices = np.array(devices)
  return Mesh(devices.reshape(shape or devices.shape), names)


def collective(x):
  """Mixes values across devices, so a misplaced block would show."""
  return lax.psum(x, "i") * 10 + x * (lax.axis_index("i") + 1)


def compare(make_args, fun=collective, **pmap_kwargs):
  """Legacy and ours on freshly made arguments (made once per implementation)."""
  pmap_kwargs.setdefault("axis_name", "i")
  return compare_with_legacy(lambda pm: pm(fun, **pmap_kwargs)(*make_args()), pmap)


# ---- host values ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64, np.bool_, np.uint8])
def test_numpy_arrays(dtype):
  compare(lambda: (data(N, 3, dtype=dtype),), fun=lambda x: (x, lax.psum(x.astype(np.int32), "i")))


def test_python_and_numpy_scalars_broadcast():
  compare(lambda: (data(N, 2), 3, np.float32(2.5), True),
          fun=lambda x, a, b, c: (x * a + b, jnp.where(c, x, -x), a * 1.5),
          in_axes=(0, None, None, None))


def test_nested_lists_and_dicts_of_numpy():
  compare(lambda: ({"a": [data(N), data(N, 2)], "b": (data(N, 1, 2),)},),
          fun=lambda t: jax.tree.map(collective, t))


# ---- single-device arrays ------------------------------------------------------------

def test_uncommitted_device_array():
  compare(lambda: (jnp.asarray(data(N, 4)),))


@pytest.mark.parametrize("device", [0, 5])
def test_array_committed_to_one_device(device):
  def make():
    x = jax.device_put(data(N, 4), jax.devices()[device])
    assert x.committed
    return (x,)
  with jax.transfer_guard_device_to_host("disallow"):
    compare(make)


def test_committed_scalar_for_in_axes_none():
  def make():
    return data(N, 2), jax.device_put(np.float32(3), jax.devices()[6])
  with jax.transfer_guard_device_to_host("disallow"):
    compare(make, fun=lambda x, s: collective(x) * s, in_axes=(0, None))


# ---- PmapSharding inputs -------------------------------------------------------------

def test_legacy_pmap_outputs():
  def make():
    return (jax.pmap(lambda x: x * 2)(data(N, 3)),)
  compare(make)


def test_legacy_pmap_outputs_mapped_on_axis_1():
  def make():
    return (jax.pmap(lambda x: x * 2, out_axes=1)(data(N, 3)),)
  with jax.transfer_guard_device_to_host("disallow"):
    compare(make, in_axes=1)


def test_legacy_pmap_output_fed_to_a_different_axis():
  # Blocks laid out for axis 0, consumed on axis 1: a real reshard.
  def make():
    return (jax.pmap(lambda x: x * 2)(data(N, N)),)
  with jax.transfer_guard_device_to_host("disallow"):
    compare(make, in_axes=1)


def test_device_put_replicated():
  def make():
    return (line_helpers.device_put_replicated(data(3, 2), jax.devices()),)
  compare(make)


def test_device_put_sharded():
  def make():
    return (line_helpers.device_put_sharded([data(2) * i for i in range(N)], jax.devices()),)
  compare(make)


def test_device_put_replicated_on_reversed_devices():
  def make():
    return (line_helpers.device_put_replicated(data(3), jax.devices()[::-1]),)
  with jax.transfer_guard_device_to_host("disallow"):
    compare(make)


def test_pmap_output_for_in_axes_none():
  # A mapped (8, 3) value passed whole to every device: needs an all-gather.
  def make():
    return data(N, 3), jax.pmap(lambda x: x + 1)(data(N, 3))
  with jax.transfer_guard_device_to_host("disallow"):
    compare(make, fun=lambda x, t: collective(x) + t.sum(), in_axes=(0, None))


def test_legacy_output_of_fewer_devices():
  def make():
    return (jax.pmap(lambda x: x + 1, devices=jax.devices()[4:])(data(4, 2)),)
  with jax.transfer_guard_device_to_host("disallow"):
    compare(make)


# ---- NamedSharding inputs ------------------------------------------------------------

@pytest.mark.parametrize("layout", ["same", "reversed", "rotated", "2d", "replicated",
                                    "subset", "axis1"])
def test_named_sharding_inputs(layout):
  devs = jax.devices()
  def make():
    x = data(N, N)
    if layout == "same":
      s = NamedSharding(mesh_of(devs), P("x"))
    elif layout == "reversed":
      s = NamedSharding(mesh_of(devs[::-1]), P("x"))
    elif layout == "rotated":
      s = NamedSharding(mesh_of(devs[3:] + devs[:3]), P("x"))
    elif layout == "2d":
      s = NamedSharding(mesh_of(devs, (4, 2), ("a", "b")), P("b", "a"))
    elif layout == "replicated":
      s = NamedSharding(mesh_of(devs), P())
    elif layout == "subset":
      s = NamedSharding(mesh_of(devs[2:6]), P("x"))
    else:
      s = NamedSharding(mesh_of(devs), P(None, "x"))
    return (jax.device_put(x, s),)
  with jax.transfer_guard_device_to_host("disallow"):
    compare(make)


def test_named_sharding_replicated_for_in_axes_none():
  def make():
    table = jax.device_put(data(5), NamedSharding(mesh_of(jax.devices()), P()))
    return data(N, 5), table
  compare(make, fun=lambda x, t: collective(x) * t, in_axes=(0, None))


def test_jit_outputs_and_mixed_kinds_in_one_call():
  def make():
    m = mesh_of(jax.devices())
    a = jax.jit(lambda v: v * 3, out_shardings=NamedSharding(m, P("x")))(data(N, 2))
    b = jax.pmap(lambda v: v - 1)(data(N, 2))
    c = jax.device_put(data(N, 2), jax.devices()[2])
    return a, b, c, data(N, 2)
  with jax.transfer_guard_device_to_host("disallow"):
    compare(make, fun=lambda a, b, c, d: collective(a + b * c - d))


def test_keyword_arguments_of_every_kind():
  def run(pm):
    f = pm(lambda x, *, y, z: collective(x + y * z), axis_name="i")
    return f(data(N), y=jax.pmap(lambda v: v)(data(N)),
             z=jax.device_put(data(N), jax.devices()[1]))
  compare_with_legacy(run, pmap)


# ---- mesh contexts -------------------------------------------------------------------

@requires("mesh_context_manager", "its jax.set_mesh form is test_call_inside_use_mesh")
def test_call_inside_with_mesh():
  def run(pm):
    with mesh_of(jax.devices()[::-1], names=("other",)):
      return pm(collective, "i")(data(N, 2))
  compare_with_legacy(run, pmap)


def test_call_inside_use_mesh():
  def run(pm):
    with line_helpers.use_mesh(mesh_of(jax.devices(), (2, 4), ("p", "q"))):
      f = pm(collective, "i")
      return f(f(data(N, 2)))
  compare_with_legacy(run, pmap)


def test_our_outputs_chain_inside_use_mesh():
  def run(pm):
    f = pm(collective, "i")
    y = f(data(N, 2))
    with line_helpers.use_mesh(mesh_of(jax.devices(), (4, 2), ("p", "q"))):
      return f(y)
  compare_with_legacy(run, pmap)


# ---- nothing moves when nothing has to ------------------------------------------------

@pytest.mark.parametrize("kind", ["ours", "legacy", "replicated", "sharded", "named"])
def test_well_placed_inputs_move_no_data(kind):
  f = pmap(collective, "i")
  ref = jax.pmap(collective, "i")
  if kind == "ours":
    x = f(data(N, 3))
  elif kind == "legacy":
    x = ref(data(N, 3))
  elif kind == "replicated":
    x = line_helpers.device_put_replicated(data(3), jax.devices())
  elif kind == "sharded":
    x = line_helpers.device_put_sharded(list(data(N, 3)), jax.devices())
  else:
    x = jax.device_put(data(N, 3), NamedSharding(mesh_of(jax.devices()), P("x")))
  expected = ref(x)
  f(x)  # compile outside the guard
  with jax.transfer_guard("disallow"):
    for _ in range(2):  # the slow path, then the C++ path
      out = f(x)
  assert_trees_equal(expected, out)


def test_well_placed_broadcast_argument_moves_no_data():
  f = pmap(lambda x, t: collective(x) + t, "i", in_axes=(0, None))
  x = f(data(N, 2), np.float32(0))
  t = jax.device_put(data(2), NamedSharding(mesh_of(jax.devices()), P()))
  f(x, t)
  with jax.transfer_guard("disallow"):
    out = f(x, t)
  assert_trees_equal(jax.pmap(lambda x, t: collective(x) + t, "i", in_axes=(0, None))(x, t), out)


def test_our_outputs_are_passed_through_without_a_copy():
  from pmap_compat import inputs
  f = pmap(collective, "i")
  y = f(data(N, 3))
  target = NamedSharding(mesh_of(jax.devices()), P("x"))
  placed = inputs.place(y, target)
  assert placed.sharding == target
  assert ([s.data.unsafe_buffer_pointer() for s in placed.addressable_shards]
          == [s.data.unsafe_buffer_pointer() for s in y.addressable_shards])


# ---- errors --------------------------------------------------------------------------

def test_deleted_input_raises_like_legacy():
  def run(pm):
    x = jnp.asarray(data(N))
    x.delete()
    return pm(collective, "i")(x)
  compare_with_legacy(run, pmap)


def test_inconsistent_sizes_across_placed_inputs_raise_like_legacy():
  def run(pm):
    x = jax.device_put(data(4, 2), NamedSharding(mesh_of(jax.devices()[:4]), P("x")))
    return pm(lambda a, b: a + b)(x, data(N, 2))
  compare_with_legacy(run, pmap)


# ---- typed PRNG keys ---------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fresh", "committed", "legacy", "named_reversed"])
def test_typed_key_inputs(kind):
  def make():
    keys = jax.random.split(jax.random.key(3), N)
    if kind == "committed":
      keys = jax.device_put(keys, jax.devices()[4])
    elif kind == "legacy":
      keys = jax.pmap(lambda k: jax.random.fold_in(k, 1))(keys)
    elif kind == "named_reversed":
      keys = jax.device_put(keys, NamedSharding(mesh_of(jax.devices()[::-1]), P("x")))
    return (keys,)
  with jax.transfer_guard_device_to_host("disallow"):
    compare(make, fun=lambda k: (jax.random.key_data(jax.random.fold_in(k, 7)),
                                 jax.random.normal(k, (2,))))


def test_our_typed_key_outputs_feed_back_without_moving_data():
  f = pmap(lambda k: jax.random.split(k)[0])
  keys = f(jax.random.split(jax.random.key(0), N))
  f(keys)
  with jax.transfer_guard("disallow"):
    out = f(keys)
  expected = jax.pmap(lambda k: jax.random.split(k)[0])(keys)
  assert_trees_equal(expected, out)
