"""A loop that builds ``pmap(lambda ...)`` afresh and calls each once, as a training loop
that re-creates its pmaps does, must stay as flat in memory as legacy pmap's.

Each loop runs in a fresh interpreter, so nothing else the suite did is cached or allocated
there. After a warm-up it is measured over N more throwaway pmaps: the growth in live Python
objects, in live jaxprs, in mapped functions still alive, and in resident memory (after
``gc.collect()`` and ``malloc_trim``, so freed heap pages are not counted). The reference is
the same loop with legacy ``jax.pmap`` on jax 0.6.0 (run in its own environment when
this is 0.10.2), and on 0.10.2 also 0.10.2's own ``jax.pmap``, which keeps far more.
"""
import json
import textwrap

import pytest

from support.jax_lines import has, running_jax
from support.venvs import LEGACY, NEWEST, run_python

# One measured loop: `python -c LOOP KIND FORM N` prints the growth as one JSON line.
LOOP = textwrap.dedent("""
  import ctypes, gc, json, os, sys, weakref
  import jax, numpy as np
  from jax._src import core
  kind, form, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
  if kind == "pmap_compat":
    import pmap_compat
    make = pmap_compat.pmap
  else:
    make = jax.pmap
  x = np.zeros((8,), np.float32)
  libc = ctypes.CDLL("libc.so.6")
  funs = []
  forms = {  # what a training loop does with the pmap it builds afresh each step
    "call": lambda fun: make(fun)(x),
    "collective": lambda fun: make(lambda v: jax.lax.psum(fun(v), "i"), axis_name="i")(x),
    "static": lambda fun: make(lambda v, k: fun(v) * k, static_broadcasted_argnums=1)(x, 2),
    "under_jit": lambda fun: jax.jit(make(fun))(x),
    "nested": lambda fun: make(make(fun))(x.reshape(2, 4)),
    "lower": lambda fun: make(fun).lower(x).compile()(x),
    "grad": lambda fun: jax.grad(lambda v: make(fun)(v).sum())(x),
  }

  def throwaway(i):  # a fresh function each time, mapped and used once
    fun = lambda v: v + i
    funs.append(weakref.ref(fun))
    jax.block_until_ready(forms[form](fun))

  def snapshot():
    gc.collect()
    libc.malloc_trim(0)  # give freed heap back, so RSS counts what is still held
    objs = gc.get_objects()
    with open("/proc/self/statm") as f:
      rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return {"objects": len(objs), "jaxprs": sum(isinstance(o, core.Jaxpr) for o in objs),
            "functions": sum(r() is not None for r in funs), "rss_mb": rss / 2**20}

  for i in range(10):  # warm-up: one-time imports, compiles and caches of this line
    throwaway(i)
  before = snapshot()
  for i in range(n):
    throwaway(10 + i)
  after = snapshot()
  print(json.dumps({k: after[k] - before[k] for k in after}))
""")

# Allowances over the reference, and why. None of them grows with N, except RSS's.
# Live objects: one-off entries of bounded caches and interned tree definitions still
# appear after the warm-up (measured 16-48 on either line, for any N); a leak that keeps
# anything per pmap keeps far more (the body jaxpr alone is ~50 objects).
OBJECT_SLACK = 100
# Live jaxprs: none kept per pmap; a few may remain from bounded caches still filling.
JAXPR_SLACK = 3
# Resident memory, slow loops only. Measured at 2,000 pmaps: pmap_compat +5.4 MB (0.6.0)
# and +5.6 MB (0.10.2), legacy +2.2 MB; native heap that malloc_trim cannot return (XLA's
# compile threads allocate in arenas of their own) spread from +2.0 to +5.5 MB over
# identical runs of 300. 16 MB leaves room for that noise and is under a third of what
# this test guards against: ~27 KB kept per pmap, 54 MB at 2,000.
RSS_SLACK_MB = 16.0


def _loop(version: str, kind: str, n: int, form: str = "call") -> dict:
  done = run_python(version, ["-W", "error::DeprecationWarning", "-c", LOOP, kind, form,
                              str(n)], timeout=900)
  assert done.returncode == 0, f"{kind} {form} on jax {version}:\n{done.stderr[-3000:]}"
  return json.loads(done.stdout.strip().splitlines()[-1])


def _check_flat(ours: dict, reference: dict, n: int) -> None:
  said = f"{n} throwaway pmaps grew pmap_compat by {ours}, the reference by {reference}"
  assert ours["functions"] <= reference["functions"], said  # every mapped function dropped
  assert ours["jaxprs"] <= reference["jaxprs"] + JAXPR_SLACK, said
  assert ours["objects"] <= reference["objects"] + OBJECT_SLACK, said


def test_throwaway_pmaps_keep_nothing():
  """Live objects after 50 throwaway pmaps: no more than legacy's (fast; RSS only in the
  message, as 50 pmaps' worth of the leak is within its noise)."""
  n = 50
  ours = _loop(running_jax(), "pmap_compat", n)
  legacy = _loop(LEGACY, "jax.pmap", n)
  _check_flat(ours, legacy, n)


@pytest.mark.slow
def test_two_thousand_throwaway_pmaps_stay_flat():
  """The loop the issue measured: 2,000 throwaway pmaps, with a bound on resident memory
  (several minutes: each pmap is traced and compiled)."""
  n = 2000
  ours = _loop(running_jax(), "pmap_compat", n)
  legacy = _loop(LEGACY, "jax.pmap", n)
  _check_flat(ours, legacy, n)
  assert ours["rss_mb"] <= legacy["rss_mb"] + RSS_SLACK_MB, (ours, legacy)


@pytest.mark.slow
@pytest.mark.jax010_only(reason="compares with 0.10.2's own jax.pmap")
def test_newest_line_keeps_no_more_than_its_own_pmap():
  """The same loop with 0.10.2's jax.pmap, on the same line. That one keeps ~5 jaxprs and
  ~1.6 MB per pmap, so 200 pmaps are enough (its 2,000 would hold 3 GB)."""
  n = 200
  ours = _loop(NEWEST, "pmap_compat", n)
  newest = _loop(NEWEST, "jax.pmap", n)
  _check_flat(ours, newest, n)
  assert ours["rss_mb"] <= newest["rss_mb"] + RSS_SLACK_MB, (ours, newest)


# jax 0.6's own eager transpose of a jit keeps each transposed jaxpr for good (its trace
# cache is keyed on a module-level function): jax.grad(lambda v: jax.jit(fresh)(v).sum())
# keeps 4 jaxprs per fresh function there, and a grad through our jit(shard_map) keeps 8.
# Legacy pmap's own transpose keeps ~2-3. Nothing is kept on 0.10.2.
_GRAD_ON_06 = pytest.mark.xfail(
    has("cached_jit_transpose"), strict=True,
    reason="this JAX's eager jit transpose caches every transposed jaxpr (as for jax.jit; "
    "capability cached_jit_transpose)")


# pmap_compat's program under the user's jit is a jit equation: where JAX's tracing keeps
# every nested jit's jaxpr (legacy's xla_pmap equation is not one), so does this loop.
_UNDER_JIT_CACHED = pytest.mark.xfail(
    has("staging_keeps_nested_jit_jaxprs"), strict=True,
    reason="this JAX's tracing keeps the jaxpr of each jit staged inside another, as for "
    "jax.jit(lambda v: jax.jit(fresh)(v)) (capability staging_keeps_nested_jit_jaxprs)")


@pytest.mark.slow
@pytest.mark.parametrize("form", ["collective", "static",
                                  pytest.param("under_jit", marks=_UNDER_JIT_CACHED),
                                  "nested", "lower", pytest.param("grad", marks=_GRAD_ON_06)])
def test_throwaway_pmaps_of_each_form_keep_nothing(form):
  """The other ways a loop may use its fresh pmap: a collective, a static argument, under
  the user's jit, nested in another fresh pmap, compiled ahead of time, differentiated."""
  n = 30
  _check_flat(_loop(running_jax(), "pmap_compat", n, form), _loop(LEGACY, "jax.pmap", n, form),
              n)
