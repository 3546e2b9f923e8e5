"""User pytree nodes whose constructors convert their fields (brax's ``UInt64`` calls
``jnp.uint32`` on its fields in ``__post_init__``): pmap_compat rebuilds a user's tree only
from arrays (or tracers), on every path, as legacy pmap and jit do.

Every program returns plain tuples so legacy's recordings can hold the results.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pmap_compat
from references import compare_with_legacy

# The types of the values the constructors below were called with.
_SEEN: list[type] = []


@dataclasses.dataclass
class UInt64:
  """Like brax's: ``__post_init__`` converts both fields with ``jnp.uint32``."""
  hi: Any
  lo: Any

  def __post_init__(self):
    _SEEN.append(type(self.hi))
    _SEEN.append(type(self.lo))
    self.hi = jnp.uint32(self.hi)
    self.lo = jnp.uint32(self.lo)


jax.tree_util.register_dataclass(UInt64, data_fields=["hi", "lo"], meta_fields=[])


class Scaled:
  """A custom-registered node whose ``__init__`` converts its leaf with ``jnp.asarray``
  and its metadata with ``int``."""

  def __init__(self, value: Any, scale: Any):
    _SEEN.append(type(value))
    self.value = jnp.asarray(value, jnp.float32)
    self.scale = int(scale)


jax.tree_util.register_pytree_node(
    Scaled, lambda s: ((s.value,), s.scale), lambda scale, children: Scaled(children[0], scale))


@functools.cache  # asked once: jit traces ``step`` only once
def _jit_passes() -> frozenset[type]:
  """What plain ``jax.jit`` itself hands these constructors besides arrays and tracers
  (jax 0.10's jit names output paths by rebuilding the output tree around avals)."""
  _SEEN.clear()
  one_device = jax.tree.map(lambda a: a[0], _inputs())
  jax.block_until_ready(jax.jit(step)(*one_device))
  seen = frozenset(t for t in _SEEN if not _is_array(t))
  _SEEN.clear()
  return seen


def _is_array(t: type) -> bool:
  return issubclass(t, (np.ndarray, np.generic, jax.Array, jax.core.Tracer))


@pytest.fixture(autouse=True)
def _constructors_see_arrays_only():
  """What the constructors saw during the test: arrays, tracers, or what jit passes."""
  allowed = _jit_passes()
  yield
  odd = sorted({t.__name__ for t in _SEEN if not _is_array(t) and t not in allowed})
  _SEEN.clear()
  assert not odd, f"a user pytree constructor was called with {odd}"


def _inputs(n: int = 8) -> tuple[UInt64, Scaled, np.ndarray]:
  counter = UInt64(np.arange(n, dtype=np.uint32), np.arange(n, dtype=np.uint32) * 3)
  scaled = Scaled(np.linspace(0.0, 1.0, n * 2, dtype=np.float32).reshape(n, 2), 3)
  return counter, scaled, np.arange(n * 3, dtype=np.float32).reshape(n, 3)


def step(counter: UInt64, scaled: Scaled, x: Any) -> tuple[UInt64, Scaled, Any]:
  new = UInt64(counter.hi + 1, counter.lo * 2)
  return new, Scaled(scaled.value * scaled.scale, scaled.scale + 1), x + counter.lo


def _plain(out: Any) -> tuple:
  """The results as plain tuples (the nodes' fields, and the metadata as an array)."""
  counter, scaled, x = out
  return (counter.hi, counter.lo), (scaled.value, np.int32(scaled.scale)), x


def test_first_call_and_steady_state_calls():
  def program(pmap):
    f = pmap(step)
    counter, scaled, x = _inputs()
    outs = []
    for _ in range(3):
      counter, scaled, x = f(counter, scaled, x)
      outs.append(_plain((counter, scaled, x)))
    return outs
  compare_with_legacy(program, pmap_compat.pmap)


def test_static_argument_and_keyword_arguments():
  def program(pmap):
    f = pmap(lambda c, k, scaled, x: step(c, scaled, x * k), static_argnums=1)
    counter, scaled, x = _inputs()
    first = f(counter, 2.0, scaled, x=x)
    second = f(first[0], 2.0, first[1], x=first[2])
    third = f(second[0], 3.0, second[1], x=second[2])
    return [_plain(o) for o in (first, second, third)]
  compare_with_legacy(program, pmap_compat.pmap)


def test_donated_tree():
  def program(pmap):
    f = pmap(step, donate_argnums=(0, 1))
    counter, scaled, x = _inputs()
    outs = []
    for _ in range(2):
      counter, scaled, x = f(counter, scaled, x)
      outs.append(_plain((counter, scaled, x)))
    return outs
  compare_with_legacy(program, pmap_compat.pmap)


def test_under_jit():
  def program(pmap):
    f = jax.jit(pmap(step))
    counter, scaled, x = _inputs()
    return [_plain(f(counter, scaled, x)), _plain(f(*f(counter, scaled, x)))]
  compare_with_legacy(program, pmap_compat.pmap)


def test_nested():
  def program(pmap):
    inner = pmap(step, axis_name="j")
    outer = pmap(lambda c, s, x: inner(c, s, x), axis_name="i")
    counter, scaled, x = _inputs(8)
    reshape = functools.partial(jax.tree.map, lambda a: np.asarray(a).reshape(2, 4, *a.shape[1:]))
    counter, x = reshape(counter), reshape(x)
    scaled = Scaled(np.asarray(scaled.value).reshape(2, 4, 2), scaled.scale)
    return _plain(outer(counter, scaled, x))
  compare_with_legacy(program, pmap_compat.pmap)


def test_tree_as_output_only():
  def program(pmap):
    f = pmap(lambda x: UInt64(x, x + 1))
    x = np.arange(8, dtype=np.uint32)
    out = f(f(x).lo)
    return out.hi, out.lo
  compare_with_legacy(program, pmap_compat.pmap)
