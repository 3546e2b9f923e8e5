"""Multi-host safety: a 2-process job (jax.distributed + gloo over 127.0.0.1, 4 CPU devices
per process) runs a pmap program as written under legacy jax.pmap, as converted without
--multihost, and as converted with it (accepted for old command lines; it changes
nothing). Either way each process passes and gets back host-local arrays, the collectives
span every process's devices (never one host's only), and the result equals legacy's bit
for bit: placed_on does it for plain sites and for pmap_via_shard_map's (options known only
at run time).
Bounded: the job is killed after TIMEOUT seconds."""
import os

import pytest

from codemod import support_module
from codemod_testing import rewrite
from support.multiprocess_jobs import run_job

WORKER = os.path.join(os.path.dirname(__file__), "mp_worker.py")
TIMEOUT = 150
PROGRAM = '''\
import jax
import numpy as np


@jax.pmap
def no_name(x):
  return x * 2


def run():
  n = jax.local_device_count()
  x = np.arange(n * 3, dtype=np.float32).reshape(n, 3) + 100 * jax.process_index()
  total = jax.pmap(lambda v: (jax.lax.psum(v, "i"), jax.lax.axis_index("i")), "i")(x)
  axes = 0  # an option known only at run time
  # Fed total's result: two programs with collectives in flight at once can take each
  # other's messages under jax 0.6.0's gloo (tests/support/multiprocess_jobs.py).
  sums = jax.pmap(lambda v: jax.lax.psum(v, "i"), "i", in_axes=axes)(total[0])
  return np.concatenate([np.ravel(a).astype(np.float32)
                         for a in (total[0], total[1], no_name(x), sums)])
'''


@pytest.fixture(scope="module")
def job(tmp_path_factory):
  return _run_programs(tmp_path_factory, PROGRAM, local_devices=4)


def _run_programs(tmp_path_factory, source, *, local_devices):
  """Each process's results for ``source`` as written (legacy), converted without
  --multihost and with it."""
  programs = tmp_path_factory.mktemp("programs")
  (programs / "legacy.py").write_text(source)
  (programs / "converted_default.py").write_text(rewrite(source, target="experimental")[0])
  (programs / "converted_multihost.py").write_text(
      rewrite(source, target="experimental", multihost=True)[0])
  support_module.write(str(programs), support_module.DEFAULT_NAME)
  outcome = run_job(WORKER, str(tmp_path_factory.mktemp("job")), args=[str(programs)],
                    local_devices=local_devices, timeout=TIMEOUT)
  assert outcome.clean and None not in outcome.results, (
      f"exit codes {outcome.returncodes}, timed out: {outcome.timed_out}\n{outcome.logs}")
  return outcome.results


def _assert_each_process_matches_legacy(job):
  """Each process's results, converted without --multihost and with it, equal legacy's."""
  for pid, results in enumerate(job):
    legacy = results["legacy"]
    assert "error" not in legacy, (pid, legacy)
    assert results["converted_default"] == legacy, (pid, results)
    assert results["converted_multihost"] == legacy, (pid, results)


def test_the_program_converts_to_plain_sites():
  new, _ = rewrite(PROGRAM, target="experimental")
  # The decorator site and the call site.
  assert new.count("@placed_on(") == 1 and new.count("placed_on(") == 2, new
  assert "on_pmap_mesh" not in new, new
  # The site whose in_axes is known only at run time.
  assert new.count("pmap_via_shard_map(") == 1, new
  assert rewrite(PROGRAM, target="experimental", multihost=True)[0] == new


@pytest.mark.multiprocess
def test_converted_matches_legacy_on_every_process(job):
  _assert_each_process_matches_legacy(job)
  # The collectives spanned both processes: their psums agree although their inputs differ.
  assert job[0]["legacy"]["value"][:3] == job[1]["legacy"]["value"][:3]


# flax's wmt example sums a value over hosts with a pmap over one device per process.
HOST_PSUM = '''\
import collections

import jax
import numpy as np


def run():
  host2devices = collections.defaultdict(list)
  for d in jax.devices():
    host2devices[d.process_index].append(d)
  devices = [host2devices[k][0] for k in host2devices]
  host_psum = jax.pmap(lambda x: jax.lax.psum(x, "i"), "i", devices=devices)
  value = np.full((1, 3), 1.0 + jax.process_index(), np.float32)
  return host_psum(value)
'''


@pytest.fixture(scope="module")
def devices_job(tmp_path_factory):
  return _run_programs(tmp_path_factory, HOST_PSUM, local_devices=2)


@pytest.mark.multiprocess
def test_devices_keeps_pmaps_meaning_across_processes(devices_job):
  # devices= is pmap's global device list: each process maps over its own devices in it.
  _assert_each_process_matches_legacy(devices_job)


# brax's trainers: the state placed on each process's first `local_devices_to_use` devices
# (every local one by default, as legacy pmap requires with several processes), so the
# converted sites' mesh spans pmap_devices(rows=local_devices_to_use).
PLACED = '''\
import jax
import numpy as np


def run(max_devices_per_host=None):
  local_devices_to_use = jax.local_device_count()
  if max_devices_per_host:
    local_devices_to_use = min(local_devices_to_use, max_devices_per_host)
  step = jax.pmap(lambda p, x: jax.lax.psum(p * x, "i"), "i")
  state = np.arange(3, dtype=np.float32) + 10 * jax.process_index()
  state = jax.device_put_replicated(state, jax.local_devices()[:local_devices_to_use])
  x = np.ones((local_devices_to_use, 3), np.float32) * (1 + jax.process_index())
  return step(state, x)
'''


@pytest.fixture(scope="module")
def placed_job(tmp_path_factory):
  return _run_programs(tmp_path_factory, PLACED, local_devices=2)


def test_the_placed_program_gets_a_mesh_over_as_many_devices():
  new, _ = rewrite(PLACED, target="experimental")
  assert "mesh = jax.sharding.Mesh(pmap_devices(rows=local_devices_to_use), (\"i\",))" in new


@pytest.mark.multiprocess
def test_placed_inputs_keep_pmaps_meaning_across_processes(placed_job):
  _assert_each_process_matches_legacy(placed_job)
  # psum spanned both processes' devices: equal results from different inputs
  assert placed_job[0]["legacy"]["value"] == placed_job[1]["legacy"]["value"]
