"""Execution: the support module's ``first_row`` is ``x[0]`` (same values, dtype, shape,
weak type; on the device of the shard holding row 0, committed to it where legacy pmap's
``x[0]`` was not) on jax 0.6.0 and 0.10.2, and a
program whose unreplicate idioms the codemod rewrites gives bit for bit what it gave
under jax.pmap: legacy pmap on 0.6.0 (both targets), 0.10.2's own jax.pmap on 0.10.2."""
import os
import shutil
import subprocess
import sys
import textwrap
import types

import pytest

from codemod_testing import load, rewrite
from support.compare import assert_trees_equal
from support.venvs import NEWEST, ROOT, run_python
from test_codemod_newest_jax import _run as run_program

SUPPORT_SOURCE = os.path.join(ROOT, "codemod", "support_source.py")

# Run as a script, here (jax 0.6.0) and in the jax 0.10.2 environment: each check
# compares first_row(x) with x[0] on the running JAX. Prints "ok" at the end.
CHECKS = textwrap.dedent("""
    import sys
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    support = {}
    with open(sys.argv[1], encoding="utf-8") as f:
      exec(compile(f.read(), sys.argv[1], "exec"), support)
    first_row = support["first_row"]
    mesh = support["pmap_mesh"](("i",), (8,))

    def put(value, spec):
      return jax.device_put(value, NamedSharding(mesh, spec))

    def same(a, b, what):
      assert type(a) is type(b), (what, type(a), type(b))
      assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
      assert getattr(a, "weak_type", None) == getattr(b, "weak_type", None), what
      assert np.asarray(a).tobytes() == np.asarray(b).tobytes(), what

    rng = np.random.default_rng(0)
    leaves = {"f32": rng.normal(size=(8, 3, 2)).astype(np.float32),
              "i8": np.arange(8, dtype=np.int8), "bool": rng.random((8, 4)) > 0.5,
              "bf16": rng.normal(size=(8, 5)).astype(jnp.bfloat16),
              "one": np.ones((8, 1, 1), np.float32)}
    legacy = jax.pmap(lambda t: t)(leaves)  # this JAX's own pmap output, and its x[0]
    for name, value in leaves.items():
      mapped = put(value, P("i"))  # a converted site's output layout
      row = first_row(mapped)
      same(row, legacy[name][0], name)
      same(row, mapped[0], name)
      assert len(row.devices()) == 1, name
      assert row.devices() == {mapped.addressable_shards[0].device}, name

    weak = put(jax.lax.broadcast(2.0, (8,)), P("i"))
    assert weak.weak_type
    same(first_row(weak), weak[0], "weak type")

    x = put(np.arange(16, dtype=np.float32).reshape(8, 2), P("i"))
    # Committed to its device (public JAX cannot hand a buffer back uncommitted, as
    # legacy's x[0] was): put on the mesh, it goes with the mesh's arrays.
    assert first_row(x).committed
    total = jax.jit(lambda a, b: a + b)(put(first_row(x), P()), x)
    assert np.asarray(total).tobytes() == np.asarray(x[0] + x).tobytes()

    replicated = put(np.arange(12, dtype=np.float32).reshape(3, 4), P())
    same(first_row(replicated), replicated[0], "replicated")
    columns = put(np.arange(24, dtype=np.float32).reshape(3, 8), P(None, "i"))
    same(first_row(columns), columns[0], "sharded over axis 1: no shard holds row 0")

    # first_rows: first_row of every leaf, whatever the leaves are.
    tree = {"mapped": [put(v, P("i")) for v in leaves.values()], "weak": weak,
            "replicated": replicated, "columns": columns, "numpy": np.arange(4.0),
            "keys": put(jax.random.split(jax.random.key(1), 8), P("i")), "none": None,
            "tuple": (x, np.int32(7) + np.zeros((2,), np.int32))}
    rows, expected = support["first_rows"](tree), jax.tree.map(lambda v: v[0], tree)
    assert jax.tree.structure(rows) == jax.tree.structure(expected)
    got_leaves = jax.tree_util.tree_flatten_with_path(rows)[0]
    for (path, got), want in zip(got_leaves, jax.tree.leaves(expected), strict=True):
      if jax.dtypes.issubdtype(want.dtype, jax.dtypes.prng_key):
        got, want = jax.random.key_data(got), jax.random.key_data(want)
      same(got, want, jax.tree_util.keystr(path))
    for row, mapped in zip(rows["mapped"], tree["mapped"], strict=True):
      assert row.devices() == {mapped.addressable_shards[0].device}

    array = np.arange(6).reshape(2, 3)
    assert type(first_row(array)) is np.ndarray and (first_row(array) == array[0]).all()
    assert first_row(np.arange(3)) == 0 and type(first_row(np.arange(3))) is np.int64
    assert first_row((x, 1)) is x and first_row([5, 6]) == 5 and first_row({0: "a"}) == "a"
    traced = jax.jit(first_row)(x)
    assert np.asarray(traced).tobytes() == np.asarray(x[0]).tobytes()
    keys = put(jax.random.split(jax.random.key(0), 8), P("i"))
    assert (np.asarray(jax.random.key_data(first_row(keys)))
            == np.asarray(jax.random.key_data(keys[0]))).all()

    def error(f, value):
      try:
        f(value)
      except Exception as e:
        return type(e)
      return None

    for value in (put(np.zeros((8,), np.float32), P("i")).reshape(8)[0], {}, 3):
      assert error(first_row, value) is error(lambda v: v[0], value) is not None, value
    gone = put(np.zeros((8, 2), np.float32), P("i"))
    gone.delete()
    assert error(first_row, gone) is error(lambda v: v[0], gone) is RuntimeError
    print("ok")
""")


def test_first_row_is_x0_on_legacy_jax(tmp_path):
  script = tmp_path / "checks.py"
  script.write_text(CHECKS)
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8")
  env.pop("PYTHONPATH", None)
  proc = subprocess.run([sys.executable, str(script), SUPPORT_SOURCE], capture_output=True,
                        text=True, env=env, timeout=300, check=False)
  assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_first_row_is_x0_on_newest_jax(tmp_path):
  script = tmp_path / "checks.py"
  script.write_text(CHECKS)
  proc = run_python(NEWEST, [str(script), SUPPORT_SOURCE])
  assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


# A Flax-style loop with every idiom the codemod rewrites. Flax is not installed: its
# jax_utils.unreplicate is FLAX_STUB (Flax's definition), for the program as written.
PROGRAM = textwrap.dedent("""
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import jax_utils


    @functools.partial(jax.pmap, axis_name="batch")
    def train_step(params, batch):
      grads = jax.tree.map(lambda p: jax.lax.pmean(jnp.mean(batch) * p, "batch"), params)
      new = jax.tree.map(lambda p, g: p - 0.25 * g, params, grads)
      return new, jax.lax.psum(jnp.sum(batch), "batch"), jnp.sum(batch, axis=0)


    def init(n):
      params = {"w": np.arange(12, dtype=np.float32).reshape(3, 4) / 8,
                "b": np.ones((1,), np.float32), "count": np.arange(3, dtype=np.int32)}
      return jax.tree.map(lambda v: np.stack([v] * n), params)


    def run():
      n = jax.local_device_count()
      batch = np.arange(n * 6, dtype=np.float32).reshape(n, 2, 3) / 16
      state, loss, per_device = train_step(init(n), batch)
      losses = [loss[0]]
      for _ in range(2):
        state, loss, per_device = train_step(state, batch)
        losses.append(loss[0])
      host = jax_utils.unreplicate(state)
      firsts = jax.tree_util.tree_map(lambda x: x[0], per_device)
      leafwise = jax.tree.map(lambda x: x[0], per_device, is_leaf=lambda v: v is None)
      again = train_step(state, batch)[0]
      return {"host": host, "losses": jnp.stack(losses), "firsts": firsts, "leafwise": leafwise,
              "tuple_index": again, "replicated": state}
""")

FLAX_STUB = ("import jax\n\n\ndef unreplicate(tree):\n"
             "  return jax.tree_util.tree_map(lambda x: x[0], tree)\n")


@pytest.fixture
def flax_stub(monkeypatch):
  flax = types.ModuleType("flax")
  jax_utils = types.ModuleType("flax.jax_utils")
  exec(FLAX_STUB, jax_utils.__dict__)
  vars(flax)["jax_utils"] = jax_utils
  monkeypatch.setitem(sys.modules, "flax", flax)
  monkeypatch.setitem(sys.modules, "flax.jax_utils", jax_utils)


def test_program_rewrites_every_idiom():
  new, _ = rewrite(PROGRAM)
  assert "from flax" not in new and "x[0]" not in new and "loss[0]" not in new
  for text in ("losses = [first_row(loss)]", "losses.append(first_row(loss))", "host = first_rows(state)",
               "firsts = first_rows(per_device)", "jax.tree.map(first_row, per_device, is_leaf",
               "first_row(train_step(state, batch))"):
    assert text in new, new


@pytest.mark.parametrize("target", ["experimental", "jax"])
def test_converted_program_matches_legacy_pmap_bit_for_bit(target, flax_stub):
  new, findings = rewrite(PROGRAM, target=target)
  assert not [f for f in findings if f.severity.value == "ERROR"], findings
  legacy = load(PROGRAM, "legacy_unreplicate").run()
  ours = load(new, f"unreplicated_{target}", with_jax_shard_map=target == "jax").run()
  assert_trees_equal(legacy, ours)


def test_converted_program_on_newest_jax_matches_its_pmap_and_legacy(tmp_path):
  original, converted = tmp_path / "original", tmp_path / "converted"
  for directory in (original, converted):
    (directory / "flax").mkdir(parents=True)
    (directory / "flax" / "__init__.py").write_text("")
    (directory / "flax" / "jax_utils.py").write_text(FLAX_STUB)
    (directory / "program.py").write_text(PROGRAM)
  shutil.rmtree(converted / "flax")  # the converted program must not need it
  cli = subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", "--target", "jax",
                        "--in-place", str(converted / "program.py")], capture_output=True,
                       text=True, cwd=ROOT, timeout=120, check=False)
  assert cli.returncode == 0 and " ERROR " not in cli.stderr, cli.stderr
  assert "first_row" in (converted / "program.py").read_text()
  newest_pmap = run_program(NEWEST, original, "program", tmp_path)
  ours = run_program(NEWEST, converted, "program", tmp_path)
  legacy = run_program("legacy", original, "program", tmp_path)
  assert ours[0] == "ok", ours[1]
  assert ours == newest_pmap
  assert ours == legacy


# Multi-host: each process unreplicates its host-local outputs (with or without
# --multihost, which changes nothing now), as it did under legacy pmap; x[0] of a global
# array would not be local.
MULTIHOST_PROGRAM = '''\
import jax
import numpy as np


step = jax.pmap(lambda x: (jax.lax.psum(x, "i"), x * 2), "i")


def run():
  n = jax.local_device_count()
  x = np.arange(n * 3, dtype=np.float32).reshape(n, 3) + 100 * jax.process_index()
  total, doubled = step(x)
  rows = jax.tree.map(lambda v: v[0], {"total": total, "doubled": doubled})
  return np.stack([rows["total"], rows["doubled"], doubled[0]])
'''


@pytest.mark.multiprocess
def test_multihost_unreplicate_matches_legacy_on_every_process(tmp_path_factory):
  from test_codemod_multiprocess import _run_programs
  converted, _ = rewrite(MULTIHOST_PROGRAM, target="experimental", multihost=True)
  assert "rows = first_rows(" in converted and "first_row(doubled)" in converted, converted
  job = _run_programs(tmp_path_factory, MULTIHOST_PROGRAM, local_devices=4)
  for pid, results in enumerate(job):
    assert "error" not in results["legacy"], (pid, results["legacy"])
    assert results["converted_default"] == results["legacy"], pid
    assert results["converted_multihost"] == results["legacy"], pid
  assert job[0]["legacy"] != job[1]["legacy"]  # each process got its own rows
