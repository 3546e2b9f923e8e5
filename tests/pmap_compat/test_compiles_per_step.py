"""A step compiles as often as under legacy pmap, however its first inputs were laid out.

Legacy pmap keyed its programs on shapes, dtypes and static arguments; jit keys them on the
inputs' layout too. Each case feeds a step first with inputs laid out one way (host numpy,
a plain jit's one-device outputs, ``device_put_replicated`` / ``device_put_sharded``,
another pmap's outputs over another axis name) and then with its own outputs, and counts
the step's compiles, called directly and through ``patched()``.

The reference is legacy's own count for the same case: measured in this process where
this JAX still has legacy pmap, else by this module run under jax 0.6.0 (``.venv``) in a
subprocess. Where legacy runs in-process, the results must also be legacy's bits.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pmap_compat
from line_helpers import device_put_replicated, device_put_sharded
from support.compare import assert_trees_equal
from support.compiles import compiles, step_compiles
from support.legacy_pmap import has_legacy_pmap, legacy_reference
from support.venvs import LEGACY, ROOT, run_python

Pmap = Callable[..., Callable[..., Any]]


def host_then_own_step(x):
  return x + 1


def other_axis_producer(x):
  return x * 2


def other_axis_step(x):
  return jax.lax.psum(x, "i") * 0.5 + x


def unmapped_scale_step(x, a):
  return x * a + jax.lax.pmean(x, "i")


def pytree_step(tree):
  return {"a": tree["a"] + 1, "b": (tree["b"][0] * 2, tree["b"][1] - tree["a"][:2])}


def replicated_step(x):
  return jax.lax.pmean(x, "i") + 1


def sharded_step(x):
  return x + jax.lax.psum(x, "i")


def donated_step(x, y):
  return x + y, y


def epoch_step(state, env, key):
  """brax PPO's shape: replicated state, a plain jit's outputs, a fresh key per step."""
  noise = jax.random.normal(jax.random.split(key)[0], env["obs"].shape)
  grad = jax.lax.pmean(jnp.mean(env["obs"]) * state["params"], "i")
  state = {"params": state["params"] - 0.1 * grad,
           "steps": {"hi": state["steps"]["hi"], "lo": state["steps"]["lo"] + 20}}
  return state, {"obs": env["obs"] + noise, "t": env["t"] + 1}, jnp.sum(grad)


def _n() -> int:
  return jax.local_device_count()


def _host_then_own(pmap: Pmap) -> Any:
  step = pmap(host_then_own_step, axis_name="i")
  x = step(np.arange(_n(), dtype=np.int32))
  for _ in range(2):
    x = step(x)
  return x


def _other_axis(pmap: Pmap) -> Any:
  x = pmap(other_axis_producer, axis_name="j")(np.arange(_n(), dtype=np.float32))
  step = pmap(other_axis_step, axis_name="i")
  for _ in range(3):
    x = step(x)
  return x


def _unmapped(pmap: Pmap) -> Any:
  step = pmap(unmapped_scale_step, axis_name="i", in_axes=(0, None))
  x = step(np.ones((_n(), 3), np.float32), np.float32(0.5))
  for _ in range(2):
    x = step(x, np.float32(0.5))
  return x


def _pytree(pmap: Pmap) -> Any:
  step = pmap(pytree_step, axis_name="i")
  tree = {"a": np.arange(_n() * 3, dtype=np.float32).reshape(_n(), 3),
          "b": (np.ones(_n(), np.int32), np.zeros((_n(), 2), np.float32))}
  for _ in range(3):
    tree = step(tree)
  return tree


def _replicated(pmap: Pmap) -> Any:
  step = pmap(replicated_step, axis_name="i")
  x = device_put_replicated(np.arange(3, dtype=np.float32), jax.local_devices())
  for _ in range(3):
    x = step(x)
  return x


def _sharded(pmap: Pmap) -> Any:
  step = pmap(sharded_step, axis_name="i")
  x = device_put_sharded([np.full(2, i, np.float32) for i in range(_n())], jax.local_devices())
  for _ in range(3):
    x = step(x)
  return x


def _donated(pmap: Pmap) -> Any:
  step = pmap(donated_step, axis_name="i", donate_argnums=(0,))
  x, y = step(np.zeros((_n(), 4), np.float32), np.ones((_n(), 4), np.float32))
  for _ in range(3):
    x, y = step(x, y)
  return x, y


def _brax_like(pmap: Pmap) -> Any:
  n = _n()
  state = device_put_replicated(
      {"params": np.ones(3, np.float32), "steps": {"hi": np.uint32(0), "lo": np.uint32(0)}},
      jax.local_devices())
  key = jax.random.PRNGKey(2)
  env = jax.jit(jax.vmap(lambda k: {"obs": jax.random.normal(k, (4,)),
                                    "t": jnp.zeros((), jnp.int32)}))(jax.random.split(key, n))
  step = pmap(epoch_step, axis_name="i")
  losses = []
  for _ in range(3):
    key, sub = jax.random.split(key)
    state, env, loss = step(state, env, jax.random.split(sub, n))
    losses.append(loss)
  return state, env, losses


# case -> (the step function whose compiles count, the run)
CASES: dict[str, tuple[str, Callable[[Pmap], Any]]] = {
    "host_then_own": ("host_then_own_step", _host_then_own),
    "other_axis_outputs": ("other_axis_step", _other_axis),
    "in_axes_0_none": ("unmapped_scale_step", _unmapped),
    "pytree": ("pytree_step", _pytree),
    "device_put_replicated": ("replicated_step", _replicated),
    "device_put_sharded": ("sharded_step", _sharded),
    "donated": ("donated_step", _donated),
    "jit_outputs_and_fresh_keys": ("epoch_step", _brax_like),
}


def _patched(run: Callable[[Pmap], Any]) -> Callable[[Pmap], Any]:
  """The run as code under ``patched()`` makes it: every jax call inside the context."""
  def under_patched(pmap: Pmap) -> Any:
    with pmap_compat.patched():
      return run(pmap)
  return under_patched


MODES: dict[str, tuple[Pmap, Callable[[Callable[[Pmap], Any]], Callable[[Pmap], Any]]]] = {
    "direct": (pmap_compat.pmap, lambda run: run),
    "patched": (lambda *a, **k: jax.pmap(*a, **k), _patched),  # looked up inside the context
}


def measure(case: str, pmap: Pmap, wrap: Callable = lambda run: run) -> tuple[int, Any]:
  """(compiles of the case's step, its results on the host), from cleared caches."""
  name, run = CASES[case]
  jax.clear_caches()
  with compiles() as counts:
    out = jax.device_get(wrap(run)(pmap))
  return step_compiles(counts, name), out


def legacy_counts() -> dict[str, int]:
  """Legacy pmap's compiles per case, in this process (only where it has legacy pmap)."""
  return {case: measure(case, legacy_reference())[0] for case in CASES}


@pytest.fixture(scope="module")
def legacy_subprocess_counts() -> dict[str, int]:
  """Legacy's counts from this module run under jax 0.6.0 (for lines without legacy)."""
  here = os.path.dirname(os.path.abspath(__file__))
  code = (f"import sys; sys.path[:0] = {[here, os.path.dirname(here), ROOT]!r}\n"
          "import json, test_compiles_per_step as t\n"
          "print('COUNTS=' + json.dumps(t.legacy_counts()))")
  proc = run_python(LEGACY, ["-W", "error::DeprecationWarning", "-c", code], timeout=600)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("COUNTS=")]
  assert proc.returncode == 0 and lines, proc.stderr[-4000:]
  return json.loads(lines[-1][len("COUNTS="):])


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_compiles_as_often_as_legacy(request, case, mode):
  pmap, wrap = MODES[mode]
  ours, out = measure(case, pmap, wrap)
  if has_legacy_pmap():
    expected, legacy_out = measure(case, legacy_reference())
    assert_trees_equal(legacy_out, out)
  else:
    expected = request.getfixturevalue("legacy_subprocess_counts")[case]
  assert expected >= 1, f"{case}: no compile of the step counted under legacy pmap"
  assert ours == expected, f"{case} ({mode}): {ours} compiles of the step; legacy pmap: {expected}"


@pytest.mark.skipif(has_legacy_pmap(), reason="in-process legacy is the reference here")
def test_both_modes_agree_without_legacy():
  """Without legacy in-process, the two ways in give the same bits for every case."""
  for case in CASES:
    _, direct = measure(case, pmap_compat.pmap)
    _, patched = measure(case, *MODES["patched"])
    assert_trees_equal(direct, patched)

