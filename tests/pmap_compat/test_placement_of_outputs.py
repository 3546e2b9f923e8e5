"""``jax.device_put_sharded`` / ``device_put_replicated`` under ``patched()`` on values taken
from pmap outputs (checkpoint restore: ``device_put_sharded([y[0]] * n, devices)``).

Legacy's ``y[0]`` is a one-device array; where the placement functions are patched() back
(JAX without them in its namespace) it is replicated over the pmap's devices, and the
restored ``device_put_sharded`` must take each such shard's value as legacy's took the
one-device ones.
"""
import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax._src import api as jax_api
from jax.sharding import NamedSharding, PartitionSpec as P, SingleDeviceSharding

import pmap_compat
from support.compare import assert_trees_equal, compare_with_legacy
from support.jax_lines import has, requires
from support.meshes import make_mesh


def arr(*shape):
  return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + 1


def _patched_where_removed():
  # Where JAX has them the legacy run must see its own (nothing is patched there).
  return contextlib.nullcontext() if has("placement_functions") else pmap_compat.patched()


def _placed(z):
  """The stacked value, each device's block in device order, and those devices' ids."""
  shards = sorted(z.addressable_shards, key=lambda s: s.index[0].start)
  return z, [s.data for s in shards], [s.device.id for s in shards]


def _first_row(pm):
  y = pm(lambda x: x + 1)(arr(8, 3))
  devices = jax.local_devices()
  z = jax.device_put_sharded([y[0]] * len(devices), devices)
  return _placed(z), pm(lambda v: v * 2)(z)


def _every_row(pm):
  y = pm(lambda x: x * 3, "i")(arr(8, 2))
  return _placed(jax.device_put_sharded([y[i] for i in range(8)], jax.local_devices()))


def _computed_from_rows(pm):
  y = pm(lambda x: x - lax.pmean(x, "i"), "i")(arr(8, 4))
  devices = jax.local_devices()
  return _placed(jax.device_put_sharded([y[0] * 2 + y[1]] * len(devices), devices))


def _replicated_output(pm):
  s = pm(lambda x: lax.psum(x, "i"), "i", out_axes=None)(arr(8, 2))
  devices = jax.local_devices()
  return _placed(jax.device_put_sharded([s] * len(devices), devices))


def _unreplicated_state(pm):
  state = pm(lambda x: {"w": x * 2, "b": (x.sum(), x[:1])})(arr(8, 3))
  one = jax.tree.map(lambda a: a[0], state)
  devices = jax.local_devices()
  stacked = jax.device_put_sharded([one] * len(devices), devices)
  replicated = jax.device_put_replicated(one, devices)
  return (jax.tree.map(_placed, stacked), jax.tree.map(_placed, replicated),
          pm(lambda a, b: jax.tree.map(jnp.add, a, b))(stacked, replicated))


def _typed_keys(pm):
  keys = pm(lambda k: jax.random.fold_in(k, 7))(jax.random.split(jax.random.key(1), 8))
  devices = jax.local_devices()
  stacked = jax.device_put_sharded([keys[i] for i in range(8)], devices)
  return stacked, pm(lambda k: jax.random.uniform(k, (2,)))(stacked)


PROGRAMS = {"first_row": _first_row, "every_row": _every_row,
            "computed_from_rows": _computed_from_rows, "replicated_output": _replicated_output,
            "unreplicated_state": _unreplicated_state, "typed_keys": _typed_keys}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_values_from_outputs_restack_like_legacy(name):
  with _patched_where_removed():
    legacy = compare_with_legacy(PROGRAMS[name], pmap_compat.pmap)
  assert legacy.error is None, legacy.error


def _spanning_arrays():
  """Arrays over several devices: replicated, sharded over a 2-D mesh, partly sharded."""
  mesh = make_mesh((4, 2))
  x = jnp.asarray(arr(8, 2))
  return {"replicated": jax.device_put(x, NamedSharding(mesh, P())),
          "sharded": jax.device_put(x, NamedSharding(mesh, P("x", "y"))),
          "partly": jax.device_put(x, NamedSharding(mesh, P(None, "y")))}


@requires("placement_removed")
@pytest.mark.parametrize("kind", ["replicated", "sharded", "partly"])
def test_restored_device_put_sharded_takes_each_arrays_value_on_device(kind):
  x = _spanning_arrays()[kind]
  devices = jax.local_devices()
  # Reference: JAX's own device_put_sharded, given the same values on one device each.
  one_device = [jax.device_put(x + i, SingleDeviceSharding(devices[0])) for i in range(8)]
  expected = jax_api.device_put_sharded(one_device, devices)
  shards = [x + i for i in range(8)]
  with pmap_compat.patched():
    with jax.transfer_guard_device_to_host("disallow"), \
         jax.transfer_guard_host_to_device("disallow"):
      ours = jax.device_put_sharded(shards, devices)
  assert_trees_equal(_placed(expected), _placed(ours))
  assert ours.sharding == expected.sharding


@requires("placement_removed")
def test_restored_device_put_sharded_keeps_jaxs_argument_errors():
  devices = jax.local_devices()
  x = _spanning_arrays()["replicated"]
  with pmap_compat.patched():
    with pytest.raises(ValueError, match="must equal"):
      jax.device_put_sharded([x] * 3, devices)
    with pytest.raises(ValueError, match="consistent shape and dtype"):
      jax.device_put_sharded([x] * 7 + [x[0]], devices)
