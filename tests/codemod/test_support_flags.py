"""The support module's flags: a repository's copy keeps the code for static arguments,
keyword arguments no position takes, shard_map before jax 0.7.2, and legacy pmap's checks
of options read at run time only where its sites need it (``support_module.FEATURES``);
the code without a flag's part runs those sites as the whole module does, and a rerun
keeps what a copy holds."""
import itertools
import json
import pathlib
import pickle
import subprocess
import sys

import numpy as np
import pytest
from codemod_testing import load, rewrite_with_support
from support.compare import assert_trees_equal
from support.venvs import NEWEST, run_python

from codemod import support_module

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLAIN = frozenset({"per_device", "placed_on"})
FLAG_SETS = [frozenset(c) for n in range(len(support_module.FEATURES) + 1)
             for c in itertools.combinations(sorted(support_module.FEATURES), n)]
# What each flag's code defines or calls: present exactly where the flag is.
MARKS = {support_module.STATIC_ARGUMENTS: "class _Static",
         support_module.KEYWORD_CALLS: "inspect.signature(",
         support_module.KEYWORD_ARGUMENTS: "_Keywords = ",
         support_module.SHARD_MAP_BEFORE_0_7_2: "jax.tree_util.Partial(",
         support_module.RUN_TIME_OPTIONS: "must be >= 0 where they map leaves"}


def _ruff(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True,
                        text=True, timeout=120, check=False)


@pytest.mark.parametrize("flags", FLAG_SETS, ids=lambda f: "+".join(sorted(f)) or "none")
def test_a_cut_keeps_each_flags_code_only_where_asked(tmp_path, flags):
  text = support_module.source(PLAIN | flags)
  # Keyword arguments no position takes come through a call that passes keywords.
  held = flags | ({support_module.KEYWORD_CALLS}
                  if support_module.KEYWORD_ARGUMENTS in flags else set())
  for flag, mark in MARKS.items():
    assert (mark in text) == (flag in held), (flag, text)
  assert not any(flag in text for flag in support_module.FEATURES)
  assert max(map(len, text.splitlines())) <= 80
  # Nothing left unused or undefined, and the imports sorted, as written.
  (tmp_path / "pmap_shard_map.py").write_text(text)
  proc = _ruff("check", "--no-cache", "--isolated", "--select", "F,I001",
               "pmap_shard_map.py", cwd=tmp_path)
  assert proc.returncode == 0, proc.stdout
  # A parameter only a dropped part read goes with it.
  assert ("def placed_on(mesh, specs, static_argnums=()):" in text) == (
      support_module.STATIC_ARGUMENTS in flags)


def test_the_whole_module_keeps_every_flags_code():
  text = support_module.source()
  assert all(mark in text for mark in MARKS.values())
  assert not any(flag in text for flag in support_module.FEATURES)


@pytest.mark.parametrize("flags", [frozenset(), frozenset({support_module.STATIC_ARGUMENTS}),
                                   frozenset({support_module.SHARD_MAP_BEFORE_0_7_2})],
                         ids=lambda f: "+".join(sorted(f)) or "none")
def test_pmap_via_shard_map_always_keeps_run_time_options_and_keywords(flags):
  """It reads pmap's options, and its function's keyword arguments, when it runs; static
  arguments and the older shard_map only where asked."""
  text = support_module.source({"pmap_via_shard_map"} | flags)
  always = {support_module.RUN_TIME_OPTIONS, support_module.KEYWORD_CALLS,
            support_module.KEYWORD_ARGUMENTS}
  for flag, mark in MARKS.items():
    assert (mark in text) == (flag in flags | always), (flag, text)
  assert ("static_broadcasted_argnums=()" in text) == (
      support_module.STATIC_ARGUMENTS in flags)
  assert ("jax.experimental.shard_map" in text) == (
      support_module.SHARD_MAP_BEFORE_0_7_2 in flags)
  assert max(map(len, text.splitlines())) <= 80


def test_a_copy_is_current_for_the_flags_it_holds_and_a_rerun_keeps_them():
  static = PLAIN | {support_module.STATIC_ARGUMENTS}
  text = support_module.source(static)
  body = text.partition("\n")[2]
  assert support_module.held_with_flags(body) == static
  assert support_module.status_of(text, PLAIN) is support_module.Status.CURRENT
  assert support_module.status_of(text, static) is support_module.Status.CURRENT
  wanting = PLAIN | {support_module.KEYWORD_ARGUMENTS}
  assert support_module.status_of(text, wanting) is support_module.Status.STALE
  assert support_module.wanted(text, wanting) == static | wanting
  # A copy an older version wrote served its files with every flag's code.
  older = '"""Helpers for pmap-to-shmap\'s output (v1 sha256:000000000000000000000000)."""\n'
  assert support_module.wanted(older, PLAIN) >= support_module.FEATURES


CALLS = {support_module.KEYWORD_CALLS}
KEYWORDS = {support_module.KEYWORD_CALLS, support_module.KEYWORD_ARGUMENTS}
SITES = {
    # A keyword reaches a position: the binding code only, where a call may pass one.
    "a def taking positions": ("def f(x):\n  return x\n\n\ng = jax.pmap(f, 'i')\n", CALLS),
    "a lambda": ("g = jax.pmap(lambda x, y: x + y)\n", CALLS),
    "a name the site rebinds": ("def main():\n  def f(x, y):\n    return x + y\n\n"
                                "  f = jax.pmap(f, 'i')\n  return f\n", CALLS),
    "a def or a partial": ("def f(x, y):\n  return x + y\n\n\nif len(__name__) > 3:\n"
                           "  f = functools.partial(f, y=1.0)\ng = jax.pmap(f)\n",
                           KEYWORDS),
    "static arguments": ("@functools.partial(jax.pmap, static_broadcasted_argnums=1)\n"
                         "def f(x, n):\n  return x * n\n",
                         {support_module.STATIC_ARGUMENTS, *CALLS}),
    "a keyword-only parameter": ("def f(x, *, y):\n  return x + y\n\n\ng = jax.pmap(f)\n",
                                 KEYWORDS),
    "a default": ("def f(x, y=1.0):\n  return x + y\n\n\ng = jax.pmap(f)\n",
                  KEYWORDS),
    "a partial": ("def f(x, y):\n  return x + y\n\n\n"
                  "g = jax.pmap(functools.partial(f, y=1.0))\n",
                  KEYWORDS),
    "a function from elsewhere": ("g = jax.pmap(jax.numpy.sin)\n",
                                  KEYWORDS),
    # Whatever the function, where no call passes keywords, no keyword code.
    "called where it is made": ("def run(x):\n  return jax.pmap(jax.numpy.sin)(x + 1)\n", set()),
    "a local only called by position": ("def run(x):\n  g = jax.pmap(jax.numpy.sin)\n"
                                        "  return g(x), [g(y) for y in x]\n", set()),
    "a private module name only called by position": (
        "_g = jax.pmap(jax.numpy.sin)\n\n\ndef run(x):\n  return _g(x)\n", set()),
    "a private def with a default": ("@jax.pmap\ndef _f(x, y=1.0):\n  return x + y\n\n\n"
                                     "def run(x):\n  return _f(x)\n", set()),
    "a local called with a keyword": ("def run(x):\n  g = jax.pmap(jax.numpy.sin)\n"
                                      "  return g(x=x)\n", KEYWORDS),
    "a local called with **": ("def run(x):\n  g = jax.pmap(jax.numpy.sin)\n"
                               "  return g(**x)\n", KEYWORDS),
    "a local handed on": ("def run(x):\n  g = jax.pmap(jax.numpy.sin)\n  g(x)\n  return g\n",
                          KEYWORDS),
    "a private def another decorator wraps": (
        "@functools.lru_cache\n@jax.pmap\ndef _f(x, y=1.0):\n  return x + y\n\n\n"
        "def run(x):\n  return _f(x)\n", KEYWORDS),
}


RUN_TIME = {support_module.RUN_TIME_OPTIONS, *KEYWORDS}
# pmap_via_shard_map's sites: static argument code only where static_broadcasted_argnums
# may reach it.
VIA_SITES = {
    "a transform": ("t = lambda f: jax.pmap(f, 'i')\n", RUN_TIME),
    "a decorator factory": ("def par(**kw):\n  return functools.partial(jax.pmap, **kw)\n",
                            RUN_TIME | {support_module.STATIC_ARGUMENTS}),
    "static arguments known at run time": (
        "def make(f, n):\n  return jax.pmap(f, 'i', static_broadcasted_argnums=n)\n",
        RUN_TIME | {support_module.STATIC_ARGUMENTS}),
    "pmap as a value": ("ps = list(map(jax.pmap, [abs, len]))\n",
                        RUN_TIME | {support_module.STATIC_ARGUMENTS}),
}
SITES.update(VIA_SITES)


@pytest.mark.parametrize("declared, old_jax", [(">=0.7.2", False), (">=0.6.1", True)])
@pytest.mark.parametrize("site", list(SITES))
def test_the_copy_holds_the_flags_its_sites_need(tmp_path, site, declared, old_jax):
  code, flags = SITES[site]
  (tmp_path / "pyproject.toml").write_text(
      f'[project]\nname = "p"\ndependencies = ["jax{declared}"]\n')
  (tmp_path / "site.py").write_text(f"import functools\n\nimport jax\n\n{code}")
  proc = subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", "--in-place",
                         str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                        timeout=120, check=False)
  assert proc.returncode == 0 and "1 converted" in proc.stderr, proc.stderr
  body = (tmp_path / "pmap_shard_map.py").read_text().partition("\n")[2]
  expected = set(flags) | ({support_module.SHARD_MAP_BEFORE_0_7_2} if old_jax else set())
  functions = PLAIN | {"pmap_devices", "pmap_via_shard_map"} if site in VIA_SITES else PLAIN
  assert support_module.held_with_flags(body) == functions | expected


HEAD = """\
import functools

import jax
import numpy as np


def add(x, y):
  return jax.lax.psum(x, "i") + y


def scale(x, *, by):
  return x * by


def repeat(x, times):
  for _ in range(times):
    x = x * 1.5 - jax.lax.pmean(x, "i")
  return x


def run():
  n = jax.local_device_count()
  x = np.linspace(-1, 1, n * 3, dtype=np.float32).reshape(n, 3)
"""
# site -> (its pmap and calls, the flags its copy needs); keyword calls of ``add`` reach
# its parameters by position.
SITE_RUNS = {
    "add": ('  p_add = jax.pmap(add, axis_name="i")\n'
            "  out = [p_add(x, x), p_add(y=x, x=x), -np.zeros_like(x) * p_add(x, y=x)]\n",
            CALLS),
    "scale": ("  p_scale = jax.pmap(scale)\n  out = [p_scale(x, by=x), p_scale(-x, by=x)]\n",
              KEYWORDS),
    "partial": ("  p_part = jax.pmap(functools.partial(scale, by=2.0))\n"
                "  out = [p_part(x), p_part(-x)]\n", set()),
    "repeat": ('  p_repeat = jax.pmap(repeat, axis_name="i", static_broadcasted_argnums=1)\n'
               "  out = [p_repeat(x, 2), p_repeat(x, 3), p_repeat(x, 2)]\n",
               {support_module.STATIC_ARGUMENTS}),
    # pmap_via_shard_map's: keyword arguments always, static ones where they may come.
    "transform": ('  p_tr = (lambda f: jax.pmap(f, axis_name="i"))(add)\n'
                  "  out = [p_tr(x, x), p_tr(-x, y=x), p_tr(x[:2], x[:2])]\n",
                  KEYWORDS),
    "late_static": ("  times = 1\n"
                    '  p_late = jax.pmap(repeat, "i", static_broadcasted_argnums=times)\n'
                    "  out = [p_late(x, 2), p_late(x, 3), p_late(x, 2)]\n",
                    {*KEYWORDS, support_module.STATIC_ARGUMENTS}),
}


@pytest.mark.parametrize("sites", [*SITE_RUNS, "all"])
def test_sites_on_the_copy_written_for_them_give_legacy_results(monkeypatch, sites):
  """Each site alone, so its copy holds just its own flags, and all together; against
  legacy jax.pmap, bit for bit."""
  chosen = list(SITE_RUNS) if sites == "all" else [sites]
  body = "".join(SITE_RUNS[name][0].replace("out = ", f"out_{name} = ") for name in chosen)
  program = HEAD + body + f"  return [{', '.join(f'out_{name}' for name in chosen)}]\n"
  new, written = rewrite_with_support(program, target="experimental")
  flags = set().union(*(SITE_RUNS[name][1] for name in chosen))
  for flag, defined in ((support_module.STATIC_ARGUMENTS, "_Static"),
                        (support_module.KEYWORD_CALLS, "inspect"),
                        (support_module.KEYWORD_ARGUMENTS, "_Keywords")):
    assert (defined in vars(written)) == (flag in flags), (flag, sorted(vars(written)))
  monkeypatch.setitem(sys.modules, support_module.DEFAULT_NAME, written)
  assert_trees_equal(load(program, f"flags_legacy_{sites}").run(),
                     load(new, f"flags_converted_{sites}").run())


def test_a_notebooks_sites_give_their_flags_to_the_copy_beside_it(tmp_path):
  (tmp_path / "pyproject.toml").write_text(
      '[project]\nname = "p"\ndependencies = ["jax>=0.7.2"]\n')
  cell = ("import functools\n\nimport jax\n\n\n"
          "@functools.partial(jax.pmap, static_broadcasted_argnums=1)\n"
          "def f(x, n):\n  return x * n\n")
  notebook = {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {},
                         "outputs": [], "source": cell.splitlines(keepends=True)}],
              "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
  (tmp_path / "run.ipynb").write_text(json.dumps(notebook))
  proc = subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", "--in-place",
                         str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                        timeout=120, check=False)
  assert proc.returncode == 0 and "1 converted" in proc.stderr, proc.stderr
  body = (tmp_path / "pmap_shard_map.py").read_text().partition("\n")[2]
  assert support_module.held_with_flags(body) == PLAIN | {support_module.STATIC_ARGUMENTS,
                                                           *CALLS}


KEYWORD_LATER = """\
import jax
import numpy as np


def shift(x, scale=1.0, by=0.0):
  return x * scale + by


_p_shift = jax.pmap(shift)


def run():
  x = np.ones((jax.local_device_count(), 3), np.float32)
  return _p_shift(x)
"""


def test_a_copy_without_the_keyword_code_refuses_what_it_cannot_pass_on(monkeypatch):
  """A site only ever called by position gets a copy without the keyword code; a later
  edit that calls it with keywords gets an error naming them (rerunning the codemod then
  adds the code), never a keyword dropped or a parameter's default in its place."""
  new, written = rewrite_with_support(KEYWORD_LATER, target="experimental")
  assert "_Keywords" not in vars(written) and "inspect" not in vars(written)
  monkeypatch.setitem(sys.modules, support_module.DEFAULT_NAME, written)
  converted = load(new, "flags_keyword_refused")
  assert_trees_equal(load(KEYWORD_LATER, "flags_keyword_legacy").run(), converted.run())
  x, scale = np.ones((8, 3), np.float32), np.full((8, 1), 2.0, np.float32)
  with pytest.raises(TypeError, match="pass by by position"):
    converted._p_shift(x, scale, by=x)
  with pytest.raises(TypeError, match="pass scale, by by position"):
    converted._p_shift(x, scale=scale, by=x)


def test_run_time_sites_on_a_copy_for_jax_0_7_2_on_match_the_newest_jax_pmap(tmp_path):
  """A repository that declares jax>=0.7.2 gets pmap_via_shard_map without the older
  shard_map's code: on the newest JAX its sites give what that JAX's own jax.pmap gives
  on the unconverted program, bit for bit."""
  runs = ("transform", "late_static")
  body = "".join(SITE_RUNS[name][0].replace("out = ", f"out_{name} = ") for name in runs)
  program = HEAD + body + f"  return [{', '.join(f'out_{name}' for name in runs)}]\n"
  original, converted = tmp_path / "original", tmp_path / "converted"
  for directory in (original, converted):
    directory.mkdir()
    (directory / "sites.py").write_text(program)
  (converted / "pyproject.toml").write_text(
      '[project]\nname = "p"\ndependencies = ["jax>=0.7.2"]\n')
  proc = subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", "--in-place",
                         str(converted)], cwd=ROOT, capture_output=True, text=True,
                        timeout=120, check=False)
  assert proc.returncode == 0 and "2 converted" in proc.stderr, proc.stderr
  copy = (converted / "pmap_shard_map.py").read_text()
  assert support_module.held_with_flags(copy.partition("\n")[2]) == PLAIN | {
      "pmap_devices", "pmap_via_shard_map", support_module.STATIC_ARGUMENTS, *RUN_TIME}
  results = []
  for directory in (original, converted):
    out = tmp_path / f"{directory.name}.pkl"
    ran = run_python(NEWEST, [str(ROOT / "tests" / "codemod" / "run_programs.py"),
                              str(directory), str(out), "sites"], timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    results.append(pickle.loads(out.read_bytes())["sites"])
  assert results[0][0] == "ok", results[0]
  assert results[1] == results[0]
