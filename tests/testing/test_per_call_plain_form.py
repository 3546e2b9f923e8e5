"""Per-call checking of code the codemod converted into its plain form.

Most converted sites are plain JAX over the support module's `per_device` and `placed_on`:

  placed_on(mesh, P("i"))(jax.jit(jax.shard_map(per_device(f), mesh=mesh, ...)))

(`jax.experimental.shard_map.shard_map` on jax 0.6.0). The support module has no hook
for testing tools: `pmap_compat.testing` recognises such a site by what it is
(converted_sites).
A program with four sites (a decorated one with donation, one with in_axes and a dict of
out_axes, one holding a loop, and one the plain form cannot express, which keeps
`on_pmap_mesh`) is recorded under legacy jax.pmap on jax 0.6.0 and checked per call, loop
iteration by loop iteration, as codemod output on jax 0.6.0 and 0.10.2. The decorated site
is called with a keyword argument, which `placed_on` passes by position: the recorded call
is the same call.
"""
import importlib.util
import os
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from codemod import support_module
from pmap_compat.testing import converted_sites, sites
from recording_cli import cli, edit_one_line, output, recorded_program
from support import venvs

sys.path.insert(0, os.path.join(venvs.ROOT, "tools"))
import equivalence  # noqa: E402  pylint: disable=wrong-import-position

PROGRAM = textwrap.dedent('''
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax


    @functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0,))
    def update(params, x):
      loss = lambda p: jnp.sum((x @ p["w"] + p["b"]) ** 2)
      grads = lax.pmean(jax.grad(loss)(params), "batch")
      return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


    def scale(x, factor):
      return {"scaled": x * factor, "top": lax.pmax(jnp.max(x), "i")}


    def walk(x):
      def step(c, _):
        c = c * 0.5 + lax.psum(c, "walkers") * 0.01
        return c, jnp.sum(c)
      return lax.scan(step, x, None, length=5)


    def power(x, n):
      return x ** n


    def run():
      x = np.linspace(-1.0, 1.0, 8 * 4 * 3, dtype=np.float32).reshape(8, 4, 3)
      params = {"w": np.full((8, 3), 0.1, np.float32), "b": np.zeros((8,), np.float32)}
      for _ in range(2):
        params = update(params, x=x)
      scaled = jax.pmap(scale, axis_name="i", in_axes=(0, None),
                        out_axes={"scaled": 0, "top": None})(x, 2.0)
      walked, sums = jax.pmap(walk, axis_name="walkers")(x)
      cubed = jax.pmap(power, static_broadcasted_argnums=1)(x, 3)
      return {"params": params, "scaled": scaled, "walked": walked, "sums": sums,
              "cubed": cubed}
''')
SITES = {"sites_prog:update": 2, "sites_prog:scale": 1, "sites_prog:walk": 1,
         "sites_prog:power": 1}  # site -> calls
ITERATIONS = 8 * 5  # walk's scan, per device
PASSED = "PASS (4 sites reached, 5 recorded calls replayed: 5 identical, 0 within tolerance)"
PASSED_ACROSS = "PASS (4 sites reached, 5 recorded calls replayed: "


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[str, str]:
  """The program, and its recording under legacy jax.pmap on jax 0.6.0."""
  return recorded_program(tmp_path_factory.mktemp("plain"), "sites_prog", PROGRAM, ITERATIONS)


def _converted(program: str, directory, target: str) -> str:
  """The codemod's rewrite: every site in the plain form, `power`'s static argument held
  by placed_on."""
  tree = equivalence.rewrite_files({program: ()}, target, str(directory))
  assert tree.error is None, tree.report
  converted = os.path.join(str(directory), os.path.basename(program))
  text = open(converted, encoding="utf-8").read()
  assert text.count("per_device") == 5 and "on_pmap_mesh" not in text, text
  assert "static_argnums=(1,))(" in text, text
  assert "jax.pmap" not in text
  return converted


# jax 0.6.0 has no jax.shard_map: the codemod writes the experimental one there.
TARGETS = [pytest.param("experimental", None, id="jax0.6.0-experimental"),
           pytest.param("jax", venvs.NEWEST, id=f"jax{venvs.NEWEST}-jax.shard_map")]


@pytest.mark.parametrize("target, version", TARGETS + [pytest.param(
    "experimental", venvs.NEWEST, id=f"jax{venvs.NEWEST}-experimental")])
def test_every_plain_site_checks_per_call_against_legacy(recorded, tmp_path, target, version):
  """Every site found, every recorded call and loop iteration replayed: bit for bit on jax
  0.6.0, within the per-call tolerance on jax 0.10.2 (also in the experimental spelling,
  a deprecated alias there: observed, and the program still gets its warning)."""
  program, out = recorded
  converted = _converted(program, tmp_path, target)
  deprecated = version is not None and target == "experimental"
  r = cli(["check", converted, "--against", out, "--per-call"], version,
          env={"PYTHONWARNINGS": "always::DeprecationWarning"} if deprecated else None)
  assert r.returncode == 0, output(r)
  if deprecated:  # where the program imports it, as without observing
    line = 1 + open(converted, encoding="utf-8").read().splitlines().index(
        "from jax.experimental.shard_map import shard_map")
    assert (f"sites_prog.py:{line}: DeprecationWarning: jax.experimental.shard_map is "
            "deprecated" in r.stderr), r.stderr
  lines = r.stdout.splitlines()
  for key, count in SITES.items():
    assert any(l.startswith(f"  site {key} (") and l.endswith(
        f"called {count} times (recorded run: {count}, {count} stored)") for l in lines), r.stdout
  verdicts = [l for l in lines if l.startswith("    call ")]
  assert len(verdicts) == 5 and "BEYOND" not in r.stdout, r.stdout
  [loops] = [l for l in lines if "loop iterations replayed" in l]
  assert loops.startswith(f"      {ITERATIONS} loop iterations replayed: "), r.stdout
  if version is None:  # the recording's own jax
    assert all(l.endswith(": identical") for l in verdicts), r.stdout
    assert f"replayed: {ITERATIONS} identical, 0 within tolerance;" in loops, r.stdout
    assert lines[-1] == PASSED, r.stdout
  else:
    assert lines[-1].startswith(PASSED_ACROSS), r.stdout


@pytest.mark.parametrize("target, version", TARGETS)
def test_a_wrong_value_at_a_plain_site_is_caught_there(recorded, tmp_path, target, version):
  """A 0.1% larger factor in `scale` and in `walk`'s loop body: each is named at its site
  (the loop's at its first iteration on device 0); the other sites still check identical."""
  program, out = recorded
  converted = _converted(program, tmp_path, target)
  edit_one_line(converted, "x * factor", "x * factor * 1.001")
  edit_one_line(converted, "c * 0.5 +", "c * 0.5005 +")
  r = cli(["check", converted, "--against", out, "--per-call"], version)
  assert r.returncode == 1, output(r)
  lines = r.stdout.splitlines()
  step = 1 + next(i for i, l in enumerate(open(converted, encoding="utf-8").read().splitlines())
                  if "lax.scan(" in l)
  by_site: dict[str, list[str]] = {}
  for line in lines:
    if line.startswith("  site "):
      site = line.split()[1]
    elif line.startswith("    call "):
      by_site.setdefault(site, []).append(line)
  others = by_site["sites_prog:update"] + by_site["sites_prog:power"]
  assert len(others) == 3 and not any("BEYOND" in l for l in others), r.stdout
  [scaled] = by_site["sites_prog:scale"]
  assert scaled.startswith("    call 0: BEYOND TOLERANCE: leaf ['scaled'] float32[8, 4, 3]: "), (
      r.stdout)
  [walked] = by_site["sites_prog:walk"]
  assert walked.startswith(f"    call 0: BEYOND TOLERANCE: in its loops: loop 0 (scan at "
                           f"sites_prog.py:{step}) iteration (0) on device 0, result "), r.stdout
  assert lines[-1].startswith("FAIL (2 calls beyond tolerance, the first: sites_prog:scale "
                              "call 0;"), r.stdout


def test_a_recording_of_plain_sites_checks_legacy_pmap(tmp_path):
  """Recorded as converted code (the observer sees each site's outputs as the program's
  function returned them), checked under legacy jax.pmap: the same sites, bit for bit."""
  # Called by position: legacy jax.pmap's call is checked against the converted call as
  # placed_on made it (the other way round, keywords are not matched with positions).
  program = str(tmp_path / "sites_prog.py")
  with open(program, "w", encoding="utf-8") as f:
    f.write(PROGRAM.replace("update(params, x=x)", "update(params, x)"))
  converted = _converted(program, tmp_path / "converted", "experimental")
  out = str(tmp_path / "rec")
  r = cli(["record", converted, "--out", out])
  assert r.returncode == 0, output(r)
  assert "recorded the first 3 calls of 4 pmap sites (5 calls," in r.stdout, r.stdout
  assert f"1 of those calls hold loops: {ITERATIONS} loop iterations stored" in r.stdout, r.stdout
  r = cli(["check", program, "--against", out, "--per-call"])
  assert r.returncode == 0, output(r)
  assert r.stdout.splitlines()[-1] == PASSED, r.stdout


# --------------------------------------------------------------------------- recognition


class _Calls:
  """An observer that runs each call and keeps what it saw."""

  def __init__(self) -> None:
    self.active = False
    self.seen: list[tuple[str, object]] = []

  def call(self, caller: sites.SiteCaller, args: tuple, kwargs: dict) -> object:
    out = caller.implementation(*args, **kwargs)
    self.seen.append((caller.site.key, out))
    return out


@pytest.fixture
def support(tmp_path):
  """A support module as the codemod writes it (header included), imported from its file."""
  path = tmp_path / "pmap_shard_map_under_test.py"
  path.write_text(support_module.source(), encoding="utf-8")
  spec = importlib.util.spec_from_file_location("pmap_shard_map_under_test", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _halves(x, y):
  return {"x": x / 2, "top": jax.lax.pmax(jnp.max(y), "i")}


def test_a_plain_site_is_recognised_by_its_support_module_code(support):
  from jax.experimental.shard_map import shard_map  # jax 0.6.0's  pylint: disable=import-outside-toplevel
  mesh = jax.sharding.Mesh(jax.devices(), ("i",))
  x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
  observer = _Calls()
  with sites.observing(observer):
    from jax.experimental.shard_map import shard_map as observed  # pylint: disable=import-outside-toplevel
    assert observed is not shard_map
    site = support.placed_on(mesh, (P("i"), P("i")))(jax.jit(observed(
        support.per_device(_halves, out_axes={"x": 0, "top": None}), mesh=mesh,
        in_specs=(P("i"), P("i")), out_specs={"x": P("i"), "top": P()}, check_rep=False)))
    out = site(x, x)
  # The program gets what placed_on makes of the site's outputs; the observer saw them as
  # _halves returned them (not packed for placed_on).
  np.testing.assert_array_equal(out["x"], x / 2)
  assert float(out["top"]) == float(x.max())
  [(key, seen)] = observer.seen
  assert key == f"{__name__}:_halves"
  assert sorted(seen) == ["top", "x"]
  np.testing.assert_array_equal(seen["x"], x / 2)
  from jax.experimental.shard_map import shard_map as restored  # pylint: disable=import-outside-toplevel
  assert restored is shard_map


def per_device(fun):
  """A program's own function of the support module's name and shape: not a site."""
  def body(*args):
    return fun(*args)
  body.__wrapped__ = fun
  return body


def test_a_look_alike_outside_a_support_module_is_not_a_site(support):
  assert converted_sites.per_device_body(per_device(_halves)) is None
  body = support.per_device(_halves)
  assert converted_sites.per_device_body(body) is body
  observer = _Calls()
  with sites.observing(observer):
    from jax.experimental.shard_map import shard_map  # pylint: disable=import-outside-toplevel
    mesh = jax.sharding.Mesh(jax.devices(), ("i",))
    jitted = jax.jit(shard_map(per_device(lambda x: x), mesh=mesh, in_specs=P("i"),
                               out_specs=P("i"), check_rep=False))
  assert not isinstance(jitted, sites.SiteCaller)
