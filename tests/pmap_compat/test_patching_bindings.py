"""``pmap_compat.patched()`` reaches names bound to JAX's ``pmap`` before it was entered.

numpyro does ``from jax import pmap`` at import time: entered after that import,
``patched()`` must route those calls to pmap_compat, and put JAX's back on exit. What it
cannot rebind (a default argument, a closure variable, a ``functools.partial``, an
instance attribute) it names in an ``UnpatchedPmapWarning``.

The reference for each call is the same module function called before ``patched()``
(legacy ``jax.pmap`` on jax 0.6.0, 0.10.2's own ``jax.pmap`` there), bit for bit.
"""
import gc
import importlib
import sys
import textwrap
import threading
import warnings

import jax
import numpy as np
import pytest

import pmap_compat
from pmap_compat import UnpatchedPmapWarning  # public: users filter it by name
from support.compare import assert_trees_equal

# In a container: patched() rebinds module globals bound to JAX's pmap, this test's too.
JAX = {"pmap": jax.pmap}
JAX_PMAP = JAX["pmap"]  # rebound while patched; read JAX["pmap"] there

EARLY = textwrap.dedent('''
    """Binds JAX's pmap at import time in every way a library does."""
    import functools

    import jax as J
    from jax import pmap

    p = J.pmap


    class Runner:
      pmap = staticmethod(J.pmap)
      plain = J.pmap


    class OnlyStatic:
      pm = staticmethod(J.pmap)


    def double(v):
      return v * 2 + J.lax.axis_index("i")


    def by_from_import():
      return pmap(double, axis_name="i")


    def by_alias():
      return p(double, axis_name="i")


    def by_staticmethod():
      return Runner.pmap(double, axis_name="i")


    def by_class_attribute():
      return Runner.plain(double, axis_name="i")


    def by_only_staticmethod():
      return OnlyStatic.pm(double, axis_name="i")


    def by_default(pm=J.pmap):
      return pm(double, axis_name="i")


    def _make_closure():
      pm = J.pmap

      def by_closure():
        return pm(double, axis_name="i")
      return by_closure


    by_closure = _make_closure()
    by_partial = functools.partial(J.pmap, axis_name="i")


    class Holder:
      def __init__(self):
        self.pm = J.pmap


    holder = Holder()
''')

LATE = textwrap.dedent('''
    from jax import pmap
''')

REACHED = ("by_from_import", "by_alias", "by_staticmethod", "by_class_attribute",
           "by_only_staticmethod")


@pytest.fixture
def package(tmp_path, monkeypatch):
  """A package ``patchpkg`` on sys.path; ``patchpkg.early`` imported (before any patch)."""
  root = tmp_path / "patchpkg"
  root.mkdir()
  (root / "__init__.py").write_text("")
  (root / "early.py").write_text(EARLY)
  (root / "late.py").write_text(LATE)
  monkeypatch.syspath_prepend(str(tmp_path))
  early = importlib.import_module("patchpkg.early")
  yield early
  for name in [n for n in sys.modules if n == "patchpkg" or n.startswith("patchpkg.")]:
    # Emptied too: JAX's caches may keep the module's functions, and through their
    # globals its references to JAX's pmap, which later patched() calls would name.
    vars(sys.modules.pop(name)).clear()


def _call(early, name):
  x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
  build = early.by_partial if name == "by_partial" else getattr(early, name)
  f = build(early.double) if name == "by_partial" else build()
  return f, jax.block_until_ready(f(x))


def _ours(f) -> bool:
  """Was ``f`` built by pmap_compat.pmap (a JAX pmap has no pmap_compat config)?"""
  return getattr(f, "_pmap_config", None) is not None


def _unreachable_warning(record) -> str:
  messages = [str(w.message) for w in record if issubclass(w.category, UnpatchedPmapWarning)]
  assert len(messages) == 1, messages
  return messages[0]


def test_names_bound_before_are_ours_while_patched_and_restored_after(package):
  early = package
  reference = {name: _call(early, name)[1] for name in REACHED}
  assert not any(_ours(_call(early, name)[0]) for name in REACHED)
  with pytest.warns(UnpatchedPmapWarning) as record:
    with pmap_compat.patched():
      assert early.pmap is pmap_compat.pmap and early.p is pmap_compat.pmap
      assert early.Runner.pmap is pmap_compat.pmap
      assert early.Runner.plain is pmap_compat.pmap
      assert isinstance(vars(early.Runner)["pmap"], staticmethod)
      for name in REACHED:
        f, out = _call(early, name)
        assert _ours(f), name
        assert_trees_equal(reference[name], out)
      # Not reachable: still JAX's pmap, as the warning says.
      for name in ("by_default", "by_closure", "by_partial"):
        assert not _ours(_call(early, name)[0]), name
      assert early.holder.pm is JAX["pmap"]
  message = _unreachable_warning(record)
  assert "patchpkg.early.by_default (a default argument)" in message
  assert "patchpkg.early._make_closure.<locals>.by_closure (closure variable 'pm')" in message
  assert "patchpkg.early.by_partial (a functools.partial)" in message
  assert "an attribute of a patchpkg.early.Holder instance" in message
  assert early.pmap is JAX_PMAP and early.p is JAX_PMAP and early.Runner.plain is JAX_PMAP
  assert vars(early.Runner)["pmap"].__func__ is JAX_PMAP
  assert not any(_ours(_call(early, name)[0]) for name in REACHED)


def test_nested_patches_restore_at_the_last_unpatch(package):
  early = package
  with pytest.warns(UnpatchedPmapWarning):
    pmap_compat.patch()
  try:
    pmap_compat.patch()  # nested: nothing searched again, nothing warned
    pmap_compat.unpatch()
    assert early.pmap is pmap_compat.pmap
  finally:
    pmap_compat.unpatch()
  assert early.pmap is JAX_PMAP and jax.pmap is JAX_PMAP


def test_names_rebound_by_the_code_meanwhile_are_left_alone(package):
  early = package
  mine = object()
  with pytest.warns(UnpatchedPmapWarning):
    with pmap_compat.patched():
      early.p = mine
  assert early.p is mine
  assert early.pmap is JAX_PMAP


def test_modules_imported_while_patched_keep_ours(package):
  """``from jax import pmap`` executed inside the block binds ours; unpatch() cannot tell
  it from ``from pmap_compat import pmap`` and leaves it (documented in patching.py)."""
  with pytest.warns(UnpatchedPmapWarning):
    with pmap_compat.patched():
      late = importlib.import_module("patchpkg.late")
      assert late.pmap is pmap_compat.pmap
  assert late.pmap is pmap_compat.pmap
  assert package.pmap is JAX_PMAP


def test_concurrent_patched_blocks_restore_once(package):
  early = package
  inside = threading.Barrier(4)
  seen = []

  def worker():
    with pmap_compat.patched():
      inside.wait()
      seen.append(early.pmap is pmap_compat.pmap)
      inside.wait()

  with pytest.warns(UnpatchedPmapWarning):
    threads = [threading.Thread(target=worker) for _ in range(3)]
    with pmap_compat.patched():
      for t in threads:
        t.start()
      inside.wait()
      inside.wait()
    for t in threads:
      t.join()
  assert seen == [True] * 3
  assert early.pmap is JAX_PMAP and jax.pmap is JAX_PMAP


def test_no_warning_when_everything_is_reachable(package, recwarn):
  del package.by_default, package.by_closure, package.by_partial, package.holder
  gc.collect()  # what earlier tests' copies of the module left behind
  with pmap_compat.patched():
    assert package.pmap is pmap_compat.pmap
  assert not [str(w.message) for w in recwarn if issubclass(w.category, UnpatchedPmapWarning)]


PREBUILT = textwrap.dedent('''
    """Functions JAX's pmap built at import time, as the Flax examples keep them."""
    import jax
    from jax import lax

    cross_replica_mean = jax.pmap(lambda x: lax.pmean(x, "x"), "x")
    same = cross_replica_mean


    @jax.pmap
    def shifted(x):
      return x + 1


    def _scaled(x, k, y):
      return (x * k + y + lax.axis_index("j"),)


    scaled = jax.pmap(_scaled, "j", in_axes=(0, None, 0), out_axes=(0,),
                      static_broadcasted_argnums=(1,), donate_argnums=(2,))


    class Holder:
      step = jax.pmap(lambda x: x - 1)
''')


@pytest.fixture
def prebuilt(tmp_path, monkeypatch):
  """A module ``prebuiltpkg`` holding functions JAX's pmap built at its import."""
  (tmp_path / "prebuiltpkg.py").write_text(PREBUILT)
  monkeypatch.syspath_prepend(str(tmp_path))
  yield importlib.import_module("prebuiltpkg")
  vars(sys.modules.pop("prebuiltpkg")).clear()


def _prebuilt_calls(module):
  x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
  y = np.ones(3, np.float32)
  return {"cross_replica_mean": module.cross_replica_mean(x), "shifted": module.shifted(x),
          "scaled": module.scaled(x, 2.0, np.stack([y] * 8))}


def test_functions_pmap_built_before_are_rebuilt_with_ours_and_restored_after(prebuilt):
  """The Flax ImageNet example's module-level ``cross_replica_mean = jax.pmap(...)``:
  rebuilt from the function and arguments JAX's pmap kept, under every name holding it,
  bit for bit with JAX's; JAX's back after the block."""
  before = {name: getattr(prebuilt, name) for name in ("cross_replica_mean", "shifted", "scaled")}
  reference = jax.block_until_ready(_prebuilt_calls(prebuilt))
  with warnings.catch_warnings(record=True) as record:
    warnings.simplefilter("always", UnpatchedPmapWarning)
    with pmap_compat.patched():
      for name, jax_built in before.items():
        ours = getattr(prebuilt, name)
        assert ours is not jax_built and _ours(ours), name
      assert prebuilt.scaled.__wrapped__ is prebuilt._scaled
      assert prebuilt.same is prebuilt.cross_replica_mean
      cfg = prebuilt.scaled._pmap_config
      assert (cfg.axis_name, cfg.in_axes, cfg.out_axes, cfg.static, cfg.donate) == (
          "j", (0, None, 0), (0,), (1,), (2,))
      assert prebuilt.shifted._pmap_config.axis_name is None
      assert_trees_equal(reference, jax.block_until_ready(_prebuilt_calls(prebuilt)))
      # Held by a class, not a module's globals: not searched (documented), stays JAX's.
      assert not _ours(prebuilt.Holder.step)
  named = [str(w.message) for w in record if issubclass(w.category, UnpatchedPmapWarning)
           and prebuilt.__name__ in str(w.message)]
  assert not named, named
  for name, jax_built in before.items():
    assert getattr(prebuilt, name) is jax_built
  assert prebuilt.same is before["cross_replica_mean"]
