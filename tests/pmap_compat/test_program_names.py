"""The name a pmap's compiled program carries (HLO module name: dumps, ``as_text()``,
profiles): legacy's ``pmap_<function name>``, not jit's ``jit_<name>``.

Legacy's names are recorded on jax 0.6.0 (``compare_with_legacy``), so the same checks
hold on 0.10.2, whose own ``jax.pmap`` names every program ``jit__fun`` (not a reference
here: ``jax_pmap=False``).
"""
import functools
import re

import jax
import numpy as np
import pytest

import pmap_compat
from pmap_compat import cache
from references import compare_with_legacy
from support.compare import run_program
from support.jax_lines import on_legacy_line, requires
from support.legacy_pmap import has_legacy_pmap, legacy_reference


def train_step(x, y):
  return x * y + jax.lax.axis_index("i")


X = np.arange(16, dtype=np.float32).reshape(8, 2)
NESTED = np.arange(16, dtype=np.float32).reshape(2, 4, 2)


def _names(f, *args) -> tuple[str, str]:
  """(module name of ``f.lower(*args)``, HLO module name of its compiled executable)."""
  lowered = f.lower(*args)
  module = re.search(r"module @(\S+)", lowered.as_text()).group(1)
  compiled = re.search(r"HloModule (\S+?),", lowered.compile().as_text()).group(1)
  return module, compiled


CASES = {
    "function": lambda pmap: _names(pmap(train_step, axis_name="i"), X, X),
    "lambda": lambda pmap: _names(pmap(lambda x: x + 1, axis_name="i"), X),
    "nested": lambda pmap: _names(
        pmap(lambda x: pmap(lambda y: y * 2, axis_name="j")(x), axis_name="i"), NESTED),
    "static_and_donated": lambda pmap: _names(
        pmap(train_step, axis_name="i", static_broadcasted_argnums=1, donate_argnums=0), X, 3.0),
}


def _legacy_names(case: str) -> tuple[str, str]:
  """Legacy's names for ``case``, which ours must equal: the release's own legacy pmap's
  where it has one (its lowering's naming is the release's: from 0.7 it strips trailing
  underscores, ``pmap__lambda``), else legacy's recording from jax 0.6.0, which is also
  checked against legacy there."""
  if on_legacy_line() or not has_legacy_pmap():
    return compare_with_legacy(CASES[case], pmap_compat.pmap, jax_pmap=False).value
  legacy = run_program(CASES[case], legacy_reference())
  ours = run_program(CASES[case], pmap_compat.pmap)
  assert legacy.error is None and ours.error is None, (legacy, ours)
  assert ours.value == legacy.value
  return legacy.value


@pytest.mark.parametrize("case", sorted(CASES))
def test_lowered_and_compiled_names_are_legacys(case):
  _legacy_names(case)


def test_partial_is_named_after_its_function():
  """Legacy names a ``functools.partial`` ``pmap__unnamed_wrapped_function_``; the function
  it wraps is what a reader of logs and profiles looks for: named as legacy names it."""
  legacy = _legacy_names("function")
  ours = _names(pmap_compat.pmap(functools.partial(train_step, y=X), axis_name="i"), X)
  assert ours == legacy


@requires("legacy_pmap", "the C++ pmap path's executables, and legacy's name for comparison")
def test_executable_a_call_compiles_is_named_as_legacys():
  """A plain call (no ``.lower()`` first) compiles the program the fast path runs."""
  from pmap_compat import fastpath  # noqa: PLC0415  # only with legacy pmap's runtime

  def step(x):
    return x * 3
  f = pmap_compat.pmap(step)
  jax.block_until_ready(f(X))
  programs = fastpath._executables(cache.entry_for(f._fun, f._pmap_config).top.jitted)
  names = {e.executable.xla_executable.hlo_modules()[0].name for e in programs.values()}
  legacy = re.search(r"HloModule (\S+?),",
                     legacy_reference()(step).lower(X).compile().as_text()).group(1)
  assert names == {legacy}
