"""The plain site form: `jax.shard_map` under `jax.jit` on a mesh the file builds, through
`per_device` and `placed_on`. Before/after text where the form is the point, and, against
legacy jax.pmap on jax 0.6.0, the results and the compiles the converted code makes."""
from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import textwrap

import jax
import libcst as cst
import numpy as np
import pytest

from codemod import support_module
from codemod.runner import Options, transform_module
from codemod_testing import load, rewrite, rewrite_with_support, support
from support.compare import assert_trees_equal

pytestmark = pytest.mark.jax06_only(reason="compares with legacy jax.pmap")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _converted(source: str, **options) -> str:
  return rewrite(textwrap.dedent(source), target="experimental", **options)[0]


def test_decorator_site_at_module_level():
  new = _converted('''\
      import functools

      import jax


      # The step.
      @functools.partial(jax.pmap, axis_name="batch", donate_argnums=(0,))
      def step(params, x):
        return params + jax.lax.pmean(x, "batch")
      ''')
  assert new == textwrap.dedent('''\
      import functools

      import jax
      from jax.experimental.shard_map import shard_map
      from jax.sharding import PartitionSpec as P

      from pmap_shard_map import per_device, placed_on


      mesh = jax.sharding.Mesh(jax.devices(), ("batch",))


      # The step.
      @placed_on(mesh, P("batch"))
      @functools.partial(jax.jit, donate_argnums=(0,))
      @functools.partial(shard_map, mesh=mesh, in_specs=P("batch"),
                         out_specs=P("batch"), check_rep=False)
      @per_device
      def step(params, x):
        return params + jax.lax.pmean(x, "batch")
      ''')


def test_call_sites_in_a_function_share_its_mesh_per_axis_name():
  new = _converted('''\
      import jax


      def train(f, g, h, x):
        p_f = jax.pmap(f, "batch")
        p_g = jax.pmap(g, "batch", in_axes=(0, None))
        p_h = jax.pmap(h, "model")
        return p_f(x), p_g(x, 1.0), p_h(x)
      ''')
  body = new[new.index("def train"):]
  assert body.count("jax.sharding.Mesh(") == 2
  # Two axis names in the file: each mesh is named after its axis.
  assert 'batch_mesh = jax.sharding.Mesh(jax.devices(), ("batch",))' in body
  assert 'model_mesh = jax.sharding.Mesh(jax.devices(), ("model",))' in body
  assert body.index("batch_mesh = ") < body.index("p_f = ")
  assert "per_device(g, in_axes=(0, None))" in body
  assert 'placed_on(model_mesh, P("model"))' in body


UNNAMED_JOINS = '''\
import jax
import numpy as np

_AXIS = "batch"


def run():
  x = np.arange(jax.local_device_count() * 3, dtype=np.float32).reshape(-1, 3)
  init = jax.pmap(lambda v: v * 2)
  step = jax.pmap(lambda v: v - jax.lax.pmean(v, _AXIS), axis_name=_AXIS)
  report = jax.pmap(lambda v: v.sum())
  state = init(x)
  for _ in range(3):
    state = step(state)
  other = jax.pmap(lambda v: v * 3)(x)
  return state, report(state), other
'''


def test_unnamed_sites_run_on_the_mesh_their_body_builds():
  """A pmap without axis_name has no name its function could read: it runs on the mesh
  its body builds for the named sites (before or after it), one mesh, one axis, so no
  input is laid out again between the sites; results and compiles are legacy's."""
  new = _converted(UNNAMED_JOINS)
  body = new[new.index("def run"):]
  assert body.count("jax.sharding.Mesh(") == 2, body  # the immediate call maps its rows
  assert "mesh = jax.sharding.Mesh(jax.devices(), (_AXIS,))" in body
  assert body.index("mesh = ") < body.index("init = ")
  assert body.count("placed_on(mesh, P(_AXIS))") == 3, body
  assert "devices_mesh = jax.sharding.Mesh(pmap_devices(x), (\"devices\",))" in body
  legacy, legacy_compiles = _run_counting(load(UNNAMED_JOINS, "unnamed_legacy"))
  ours, our_compiles = _run_counting(load(new, "unnamed_converted"))
  assert_trees_equal(legacy, ours)
  assert len([n for n in our_compiles if "lambda" in n]) == len(
      [n for n in legacy_compiles if "lambda" in n]), (legacy_compiles, our_compiles)


def test_a_mesh_goes_into_the_branch_that_holds_its_sites_not_into_a_loop():
  source = textwrap.dedent('''\
      import jax


      def sample(run, x, method):
        if method == "sequential":
          return run(x)
        elif method == "parallel":
          # one chain per device
          return jax.pmap(run)(x)


      def both(f, g, x, flag):
        out = None
        if flag:
          with jax.default_matmul_precision("float32"):
            a = jax.pmap(f)(x)
            out = a, jax.pmap(g)(a)
        return out


      def each(f, xs):
        for x in xs:
          if x is not None:
            y = jax.pmap(f)(x)
        return y
      ''')
  new = _converted(source)
  mesh = 'mesh = jax.sharding.Mesh(jax.devices(), ("devices",))'
  # Called where they are made, on a name bound before: over the devices pmap chose.
  rows = 'mesh = jax.sharding.Mesh(pmap_devices(x), ("devices",))'
  assert f'  elif method == "parallel":\n    {rows}\n    # one chain per device\n' in new, new
  assert f'precision("float32"):\n      {rows}\n      a = placed_on(' in new, new
  # a, bound in the same branch, is there right before the statement that reads it
  rows_of_a = 'devices_mesh = jax.sharding.Mesh(pmap_devices(a), ("devices",))'
  assert f'      {rows_of_a}\n      out = a, placed_on(' in new, new
  # x, bound by the loop, is not there before it
  assert f'def each(f, xs):\n  {mesh}\n  for x in xs:' in new, new
  assert new.count("jax.sharding.Mesh(") == 4, new
  outputs = load(source, "branch_legacy"), load(new, "branch_converted")
  x = np.arange(8.0, dtype=np.float32)
  for module in outputs:
    module.run = lambda m=module: (m.sample(lambda v: v * 2, x, "parallel"),
                                   m.both(lambda v: v + 1, jax.numpy.sin, x, True),
                                   m.each(lambda v: v - 1, [x, None]))
  assert_trees_equal(outputs[0].run(), outputs[1].run())


def test_a_script_main_blocks_mesh_is_not_said_to_be_built_at_import():
  source = textwrap.dedent('''\
      import jax


      def step(x):
        return jax.lax.psum(x, "batch")


      p_first = jax.pmap(step, axis_name="batch")

      if __name__ == "__main__":
        p_step = jax.pmap(step, axis_name="batch")
      ''')
  new, findings = rewrite(source, target="experimental")
  assert 'if __name__ == "__main__":\n  mesh = jax.sharding.Mesh(' not in new, new
  said = [f.line for f in findings if "built when the module is imported" in f.message]
  assert said == [8, 11], findings  # the two sites share the mesh built at module level
  alone, findings = rewrite(source.replace("p_first = jax.pmap(step, axis_name=\"batch\")\n",
                                           ""), target="experimental")
  assert 'if __name__ == "__main__":\n  mesh = jax.sharding.Mesh(' in alone, alone
  assert not [f for f in findings if "built when the module is imported" in f.message]


@pytest.mark.parametrize("bound", ['_PMAP_AXIS_NAME = "i"',
                                   "_PMAP_AXIS_NAME = layers.PMAP_AXIS_NAME",
                                   "from layers import PMAP_AXIS_NAME as _PMAP_AXIS_NAME"])
@pytest.mark.parametrize("rebinds", [False, True])
def test_sites_with_the_same_module_constant_axis_share_a_mesh(rebinds, bound):
  """An axis name held in a module constant (a string, or a value another module gives
  once) means the same at each site, as a literal does: one mesh per function, named
  after the constant. A constant something rebinds (``global``) gets a mesh before each
  site's own statement."""
  new = _converted('''\
      import jax
      import layers

      ''' + bound + '''


      def train(f, g, x, flag):
        reset = jax.pmap(f, axis_name=_PMAP_AXIS_NAME)
        if flag:
          x = reset(x)
        step = jax.pmap(g, axis_name=_PMAP_AXIS_NAME, in_axes=(0, None))
        return jax.pmap(f, "j")(step(x, 1.0))
      ''' + (textwrap.indent("\n\ndef rename():\n  global _PMAP_AXIS_NAME\n"
                             "  _PMAP_AXIS_NAME = 'k'\n", "      ") if rebinds else ""))
  body = new[new.index("def train"):]
  meshes = [line.strip() for line in body.splitlines() if "jax.sharding.Mesh(" in line]
  if rebinds:
    assert meshes == ["pmap_axis_name_mesh = jax.sharding.Mesh(jax.devices(), (_PMAP_AXIS_NAME,))",
                      "mesh = jax.sharding.Mesh(jax.devices(), (_PMAP_AXIS_NAME,))",
                      'j_mesh = jax.sharding.Mesh(jax.devices(), ("j",))'], body
  else:
    assert meshes == ["pmap_axis_name_mesh = jax.sharding.Mesh(jax.devices(), (_PMAP_AXIS_NAME,))",
                      'j_mesh = jax.sharding.Mesh(jax.devices(), ("j",))'], body
    assert body.count("placed_on(pmap_axis_name_mesh, ") == 2, body


def test_mesh_name_the_file_uses_is_not_taken_and_a_variable_axis_waits_for_its_value():
  new = _converted('''\
      import jax


      def train(f, x, mesh, axis):
        del mesh
        name = axis
        p_f = jax.pmap(f, name)
        return p_f(x)
      ''')
  assert "mesh = jax" not in new.replace("_mesh = jax", "")
  lines = new.splitlines()
  built = next(i for i, line in enumerate(lines) if "jax.sharding.Mesh(jax.devices(), (name,))" in line)
  assert "name = axis" in lines[built - 1]


def test_a_third_mesh_of_one_axis_in_a_function_is_numbered():
  # flashbax's tests: `mesh` and `devices_mesh` taken, the next is `mesh_2`.
  new = _converted('''\
      import jax


      def run(f, g, h, x, y):
        a = jax.pmap(f)(x)
        b = jax.pmap(g, static_broadcasted_argnums=1)(a, 2)
        c = jax.pmap(h)(b, y)
        return c
      ''')
  assert 'mesh_2 = jax.sharding.Mesh(pmap_devices(b, y), ("devices",))' in new, new


@pytest.mark.parametrize("code,where", [
    ("  out = [jax.pmap(f, 'i')(x) for _ in range(3)]\n", "in a comprehension"),
    ("  for _ in range(3):\n    out = jax.pmap(f, 'i')(x)\n", "in a loop"),
    ("  out = jax.pmap(f, 'i')(x)\n", "called inside a function"),
])
def test_a_site_built_each_time_it_runs_is_reported(code, where):
  source = "import jax\n\n\ndef run(f, x):\n" + code + "  return out\n"
  _, findings = rewrite(source, target="experimental")
  warnings = [f.message for f in findings if f.severity.name == "WARNING"]
  assert len(warnings) == 1 and where in warnings[0], findings


def test_a_lambda_built_each_time_is_not_reported():
  # Legacy pmap compiled a new lambda each time too.
  source = "import jax\n\n\ndef run(x):\n  return jax.pmap(lambda v: v, 'i')(x)\n"
  _, findings = rewrite(source, target="experimental")
  assert not [f for f in findings if f.severity.name == "WARNING"], findings


MADE_PER_CALL = {
    "a_def": "  def f(v):\n    TRACES.append(1)\n    return v * k\n",
    "a_partial": "  f = functools.partial(scale, k=k)\n",
    "a_lambda": "  f = lambda v: scale(v, k)\n",
}


@pytest.mark.parametrize("made", sorted(MADE_PER_CALL))
def test_a_function_made_on_each_call_is_not_reported_legacy_traced_it_again_too(made):
  """A def, partial or lambda the enclosing function makes: legacy pmap traced it again on
  each call of that function, as the converted site does, so there is nothing to report."""
  source = ("import functools\n\nimport jax\nimport numpy as np\n\nTRACES = []\n\n\n"
            "def scale(v, k):\n  TRACES.append(1)\n  return v * k\n\n\n"
            "def run(k):\n  x = np.ones((jax.local_device_count(), 2), np.float32)\n"
            + MADE_PER_CALL[made] + "  return jax.pmap(f, 'i')(x)\n")
  legacy = load(source, f"per_call_legacy_{made}")
  legacy.run(2.0)
  legacy.run(2.0)
  assert len(legacy.TRACES) == 2  # legacy traced it on each call
  new, findings = rewrite(source, target="experimental")
  assert not [f for f in findings if f.severity.name == "WARNING"], findings
  converted = load(new, f"per_call_converted_{made}")
  converted.run(2.0)
  converted.run(2.0)
  assert len(converted.TRACES) == 2


COMPILES = '''\
import jax
import numpy as np


def step(x):
  return x + 1


def init(x):
  return x * 2


def run():
  n = jax.local_device_count()
  p_init = jax.pmap(init)
  p_step = jax.pmap(step, axis_name="i")
  c = p_step(np.zeros(n, np.int32))
  c = p_step(c)
  p = p_init(np.zeros(n, np.float32))
  for _ in range(3):
    p = p_step(p)
  r = jax.device_put_replicated(np.float32(3.0), jax.local_devices())
  r = p_step(r)
  one = jax.device_put(np.ones(n, np.float32), jax.devices()[0])
  return c, p, r, p_step(one)
'''


class _Compiles(logging.Handler):
  def __init__(self) -> None:
    super().__init__()
    self.names: list[str] = []

  def emit(self, record: logging.LogRecord) -> None:
    message = record.getMessage()
    if "Finished XLA compilation of " in message:
      self.names.append(message.split("Finished XLA compilation of ")[1].split(" in ")[0])


def _run_counting(module) -> tuple[object, list[str]]:
  handler = _Compiles()
  logger = logging.getLogger("jax")
  logger.addHandler(handler)
  previous = logger.level
  logger.setLevel(logging.WARNING)
  try:
    with jax.log_compiles(True):
      out = module.run()
  finally:
    logger.removeHandler(handler)
    logger.setLevel(previous)
  return out, handler.names


def test_inputs_made_anyhow_compile_the_step_as_legacy_did():
  """numpy, the step's own outputs, another site's outputs on another axis name, a
  replicated value and an array on one device: the step compiles once per dtype."""
  legacy, legacy_compiles = _run_counting(load(COMPILES, "compiles_legacy"))
  ours, our_compiles = _run_counting(load(_converted(COMPILES), "compiles_converted"))
  assert_trees_equal(legacy, ours)
  legacy_steps = [n for n in legacy_compiles if "step" in n]
  our_steps = [n for n in our_compiles if "step" in n]
  assert len(our_steps) == len(legacy_steps) == 2, (legacy_compiles, our_compiles)


def test_fewer_rows_than_devices_where_the_code_does_not_show_them():
  # An argument made with 2 rows gives the mesh 2 devices; one whose rows this cannot read
  # (here a method's result) leaves it over every device, where JAX rejects 2 rows on 8.
  made = "np.ones((2, 3), np.float32)"
  for argument, shown in ((made, True), (f"{made}.copy()", False)):
    source = "import jax\nimport numpy as np\n\n\ndef run():\n" \
             f"  return jax.pmap(lambda v: v * 2)({argument})\n"
    legacy = load(source, f"rows_legacy_{shown}").run()
    assert legacy.shape == (2, 3)
    new, findings = rewrite(source, target="experimental")
    assert ("pmap_devices(rows=2)" in new) == shown, new
    # The report says it at the site, before any run.
    fix = [f.line for f in findings if "jax.devices()[:rows]" in f.message]
    assert fix == ([] if shown else [6]), findings
    if shown or jax.device_count() == 2:
      assert_trees_equal(legacy, load(new, f"rows_converted_{shown}").run())
    elif jax.device_count() > 2:
      with pytest.raises(ValueError, match="should be divisible by"):
        load(new, f"rows_converted_{shown}").run()


ROWS = """\
import jax
import numpy as np


def run(map_args):
  return jax.pmap(lambda v: jax.tree.map(lambda l: l * 2, jax.lax.psum(v, "i")),
                  axis_name="i")(map_args)


def run_pair(a, b):
  return jax.pmap(lambda x, y: x + y, in_axes=(None, 0))(a, b)


def run_each(xs):
  for x in xs:  # x is bound by the statement the mesh would go before
    out = jax.pmap(lambda v: v + 1)(x)
  return out


def run_state(state):
  # brax's replay buffer: the statement rebinds state, after the site has read it
  state, out = jax.pmap(lambda s: (s + 1, s * 2))(state)
  return state, out


def run_branch(w, parallel=True):
  # MJX's renderer: the branch makes the arguments, then calls a pmap on them; each
  # site's mesh goes right before its own statement, after what it reads
  if parallel:
    x = w * 2
    first = jax.pmap(lambda v: v - 1)(x)
    x = np.concatenate([x, x]) if len(x) * 2 <= jax.device_count() else x[:1]
    return first, jax.pmap(lambda v: v + 1)(x)
  return None
"""


@pytest.mark.parametrize("rows", [1, 2, jax.device_count()])
def test_a_site_called_where_it_is_made_maps_as_many_devices_as_rows(rows):
  # run_each's mesh spans jax.devices(): for fewer rows it raises
  # (test_fewer_rows_than_devices_names_the_fix); here all rows.
  """``pmap(f)(x)`` on names: the mesh spans the devices legacy pmap chose for that call
  (numpyro's ``pmap(fn)(map_args)`` with fewer chains than devices)."""
  new = _converted(ROWS)
  assert 'jax.sharding.Mesh(pmap_devices(map_args), ("i",))' in new
  assert "pmap_devices(a, b, in_axes=(None, 0))" in new
  assert 'jax.sharding.Mesh(pmap_devices(state), ("devices",))' in new
  assert new.count("pmap_devices(x)") == 2, new  # run_branch's, each before its site
  assert new.count("pmap_devices(") == 5, new  # not run_each's: x is the loop's
  legacy, ours = load(ROWS, f"rows_legacy_{rows}"), load(new, f"rows_converted_{rows}")
  tree = {"w": np.arange(rows * 3, dtype=np.float32).reshape(rows, 3),
          "n": np.arange(rows, dtype=np.int32)}
  for name, args in (("run", (tree,)), ("run_state", (tree["w"],)),
                     ("run_branch", (tree["w"],)),
                     ("run_pair", (np.float32(-0.0), np.linspace(-1, 1, rows * 2,
                                                                  dtype=np.float32).reshape(rows, 2)))):
    want, got = getattr(legacy, name)(*args), getattr(ours, name)(*args)
    assert_trees_equal(want, got)
    for w, g in zip(jax.tree.leaves(want), jax.tree.leaves(got), strict=True):
      assert {d.id for d in w.devices()} == {d.id for d in g.devices()}
  every = np.ones((jax.device_count(), 3), np.float32)
  assert_trees_equal(legacy.run_each([every]), ours.run_each([every]))


# flashbax's tests: a static argument beside the rows.
STATIC_ROWS = """\
import jax


def scaled(x, n):
  return x * n


def run(x, n):
  return jax.pmap(scaled, static_broadcasted_argnums=1)(x, n)
"""


@pytest.mark.parametrize("rows", [1, 2, jax.device_count()])
def test_a_site_called_where_it_is_made_with_a_static_argument_maps_its_rows(rows):
  new = _converted(STATIC_ROWS)
  assert 'jax.sharding.Mesh(pmap_devices(x, n, in_axes=(0, None)), ("devices",))' in new, new
  x = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
  legacy = load(STATIC_ROWS, f"static_rows_legacy_{rows}").run(x, 3)
  ours = load(new, f"static_rows_converted_{rows}").run(x, 3)
  assert_trees_equal(legacy, ours)


@pytest.mark.parametrize("bad", [[1], np.float32(1), (np.ones(2), np.ones(3)),
                                 np.ones(jax.device_count() + 1)],
                         ids=["int_list", "scalar", "inconsistent", "too_many_rows"])
def test_a_site_called_where_it_is_made_rejects_what_legacy_rejected(bad):
  # jaxline's own tests expect legacy's ValueError for these, and its wording for rank 0.
  legacy, ours = load(ROWS, "bad_rows_legacy"), load(_converted(ROWS), "bad_rows_converted")
  with pytest.raises(ValueError) as want:
    legacy.run(bad)
  with pytest.raises(ValueError) as got:
    ours.run(bad)
  if "rank" in str(want.value):
    assert str(got.value) in str(want.value)


@jax.tree_util.register_pytree_node_class
class _Checked:
  """A pytree whose unflatten checks its leaves, as brax's UInt64 does (it casts them)."""

  def __init__(self, value):
    if value is None:
      raise TypeError(f"_Checked holds an array, got {value!r}")
    self.value = value

  def tree_flatten(self):
    return (self.value,), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    del aux
    return cls(*children)


def test_pmap_devices_reads_the_arguments_without_rebuilding_them():
  # brax's assert_is_replicated: the training state holds UInt64 leaves, which a tree
  # rebuilt with anything but arrays rejects.
  helpers = support()
  state = {"step": _Checked(np.zeros((2, 1), np.uint32)), "w": np.ones((2, 3))}
  assert helpers.pmap_devices(state) == jax.devices()[:2]
  assert helpers.pmap_devices(1.0, state, in_axes=(None, 0)) == jax.devices()[:2]


def test_pmap_devices_is_every_device_in_a_multi_process_job(monkeypatch):
  helpers = support()
  x = np.ones((2, 3), np.float32)
  assert helpers.pmap_devices(x) == jax.devices()[:2]
  assert helpers.pmap_devices(1.0, x, in_axes=(None, 0)) == jax.devices()[:2]
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  assert helpers.pmap_devices(x) == jax.devices()


def test_a_mesh_over_the_devices_pmap_was_given_says_nothing_of_rows():
  # devices= (and axis_size=) chose the devices; backend= left pmap to count rows.
  _, findings = rewrite(DEVICES, target="experimental")
  said = [f.message for f in findings if "[:rows]" in f.message]
  assert len(said) == 1 and 'jax.devices("cpu")[:rows]' in said[0], findings


def test_support_module_holds_what_the_files_call(tmp_path):
  small = support_module.source(["per_device", "placed_on"])
  assert support_module.held(small.partition("\n")[2]) == {"per_device", "placed_on"}
  assert "def on_pmap_mesh" not in small and len(small.splitlines()) < len(
      support_module.source().splitlines()) // 3
  compile(small, "pmap_shard_map.py", "exec")
  assert support_module.write(str(tmp_path), "pmap_shard_map", ["per_device", "placed_on"])
  path = tmp_path / "pmap_shard_map.py"
  assert support_module.status_of(path.read_text(), ["placed_on"]) is support_module.Status.CURRENT
  assert support_module.status_of(path.read_text(), ["first_row"]) is support_module.Status.STALE
  # A run that needs more grows the module, keeping what it held.
  assert support_module.write(str(tmp_path), "pmap_shard_map", ["first_row"])
  assert support_module.held(path.read_text().partition("\n")[2]) >= {
      "per_device", "placed_on", "first_row"}


SCRIPT = '''\
import functools

import jax
import numpy as np


@functools.partial(jax.pmap, axis_name="batch")
def step(x):
  return jax.lax.psum(x, "batch")


if __name__ == "__main__":
  print(np.asarray(step(np.arange(jax.local_device_count() * 2.0).reshape(-1, 2))).tolist())
'''


def test_a_script_runs_from_its_own_directory_as_its_readme_says(tmp_path):
  example = tmp_path / "examples" / "mnist"
  example.mkdir(parents=True)
  (example / "main.py").write_text(SCRIPT)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu", PYTHONPATH="")

  def run_script() -> str:
    done = subprocess.run([sys.executable, "main.py"], cwd=example, env=env,
                          capture_output=True, text=True, check=True)
    return done.stdout

  legacy = run_script()
  subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", "--in-place",
                  "--target", "experimental", str(tmp_path)], cwd=ROOT, check=True,
                 capture_output=True)
  assert (example / "pmap_shard_map.py").exists()
  assert "placed_on" in (example / "main.py").read_text()
  assert run_script() == legacy


LIBRARY = '''\
"""Helpers a program imports before it calls jax.distributed.initialize."""
import functools

import jax
from jax import lax

pmap_mean = jax.pmap(lambda x: lax.pmean(x, "i"), axis_name="i")  # the mean


@functools.partial(jax.pmap, axis_name="i", donate_argnums=0)
def scaled(x, k):
  return lax.psum(x * k, "i")


TRANSFORMS = {"pmap": lambda f: jax.pmap(f, "i")}
'''

PROGRAM = '''\
import os
import pickle
import socket
import sys

import numpy as np

from pkg import helpers
from jax._src import xla_bridge

started = xla_bridge.backends_are_initialized()
with socket.socket() as s:
  s.bind(("127.0.0.1", 0))
  port = s.getsockname()[1]
import jax
from jax import lax
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=1, process_id=0)
x = np.arange(24, dtype=np.float32).reshape(8, 3)
mean = helpers.pmap_mean(x)
kept = np.asarray(mean)
out = helpers.scaled(helpers.scaled(mean, np.full((8, 1), 2.0, np.float32)),
                     np.full((8, 1), 0.5, np.float32))
lowered = helpers.scaled.lower(x, np.ones((8, 1), np.float32)) is not None
total = helpers.TRANSFORMS["pmap"](lambda v: lax.psum(v, "i"))(x)
sys.stdout.buffer.write(pickle.dumps((started, lowered, kept, np.asarray(out),
                                      np.asarray(total))))
'''


def test_module_level_sites_of_a_library_are_made_on_their_first_call(tmp_path):
  """A module-level site in a library module (or in a program that calls
  jax.distributed.initialize) asks JAX for no device at import: its mesh is a cached
  function and the site, the plain form's code, is made by on_first_call (where
  importing builds it: not in a lambda). A program importing the library first still
  initializes, and gets legacy's results."""
  results, converted = [], ""
  for name, text in (("legacy", LIBRARY), ("converted", None)):
    root = tmp_path / name
    (root / "pkg").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "helpers.py").write_text(LIBRARY)
    (root / "program.py").write_text(PROGRAM)
    if text is None:
      subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", "--in-place",
                      "--target", "experimental", str(root / "pkg")], cwd=ROOT, check=True,
                     capture_output=True)
      converted = (root / "pkg" / "helpers.py").read_text()
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu", PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, "program.py"], cwd=root, env=env,
                          capture_output=True, check=True, timeout=300)
    results.append(pickle.loads(done.stdout))
  legacy, ours = results
  assert ours[:2] == legacy[:2] == (False, True)
  assert_trees_equal(legacy[2:], ours[2:])
  support_import = ("from pkg._pmap_shard_map import (on_first_call, per_device, placed_on,\n"
                    "                                 pmap_via_shard_map)\n")
  assert converted.split(support_import)[1] == (
      textwrap.dedent('''

      @functools.cache
      def mesh():
        return jax.sharding.Mesh(jax.devices(), ("i",))


      pmap_mean = on_first_call(
          lambda: placed_on(mesh(), P("i"))(
              jax.jit(shard_map(per_device(lambda x: lax.pmean(x, "i")), mesh=mesh(),
                                in_specs=P("i"), out_specs=P("i"),
                                check_rep=False))))  # the mean


      @on_first_call(
          lambda f: placed_on(mesh(), P("i"))(
              jax.jit(shard_map(per_device(f), mesh=mesh(), in_specs=P("i"),
                                out_specs=P("i"), check_rep=False),
                      donate_argnums=0)))
      def scaled(x, k):
        return lax.psum(x * k, "i")


      TRANSFORMS = {"pmap": lambda f: pmap_via_shard_map(f, "i")}
      ''')), converted


@pytest.mark.parametrize("imported, spelled", [
    ("import functools\n", "@functools.cache"),
    ("from functools import partial\n", "@cache"),  # diffusers' pipelines
    ("from functools import partial\n\ncache = {}\n", "@functools.cache"),
])
def test_a_lazy_mesh_is_cached_as_the_file_imports_functools(tmp_path, imported, spelled):
  (tmp_path / ".git").mkdir()
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "__init__.py").write_text("")
  path = tmp_path / "pkg" / "steps.py"
  source = (f"{imported}\nimport jax\n\n\n"
            "@partial(jax.pmap, axis_name='i')\n" if "partial" in imported else
            f"{imported}\nimport jax\n\n\n@functools.partial(jax.pmap, axis_name='i')\n")
  source += "def total(x):\n  return jax.lax.psum(x, 'i')\n"
  path.write_text(source)
  out = transform_module(cst.parse_module(source), Options(target="experimental"), str(path))
  new = out.module.code
  assert f"{spelled}\ndef mesh():" in new, new
  # The site read partial last: the import holds just cache.
  assert ("from functools import cache\n" in new) == (spelled == "@cache"), new
  compile(new, str(path), "exec")


DEVICES = '''\
import functools

import jax
import numpy as np


def run():
  devices = jax.devices()[::-1]  # pmap puts row i on devices[i]
  f = jax.pmap(lambda x: x * jax.lax.axis_index("i") + jax.lax.psum(x, "i"), "i",
               devices=devices)
  g = jax.pmap(lambda x: x - 1, backend="cpu")

  @functools.partial(jax.pmap, axis_name="j", devices=jax.devices()[:4])
  def h(x):
    return jax.lax.psum(x, "j")

  x = np.arange(8.0, dtype=np.float32)
  out = f(x)
  return (out, [s.device.id for s in out.addressable_shards], g(x), h(np.arange(4.0)),
          [jax.pmap(lambda y: y + 1, devices=[d])(np.ones(1)) for d in devices[:2]])
'''


def test_devices_and_backend_give_the_mesh_its_devices():
  """pmap's devices= (and backend=) become the devices of the site's mesh, which is
  built right before the site's statement (where the list has its value); a devices=
  that names a comprehension's variable goes to pmap_via_shard_map, pmap's own call."""
  new = _converted(DEVICES)
  assert "i_mesh = jax.sharding.Mesh(devices, (\"i\",))" in new
  assert "jax.sharding.Mesh(jax.devices(\"cpu\"), (\"devices\",))" in new
  assert "j_mesh = jax.sharding.Mesh(jax.devices()[:4], (\"j\",))" in new
  assert new.count("pmap_via_shard_map(") == 1 and "devices=[d]" in new
  legacy = load(DEVICES, "devices_legacy").run()
  ours = load(new, "devices_converted").run()
  assert ours[1] == legacy[1] == [d.id for d in jax.devices()[::-1]]
  assert_trees_equal(legacy, ours)


@pytest.mark.parametrize("between", [
    "  devices = devices[::-1]\n",          # bound again in the block
    "  random.shuffle(devices)\n",          # changed by a call
    "  devices.reverse()\n",                # changed by a method
])
def test_devices_the_statement_may_change_go_to_pmap_via_shard_map(between):
  source = ("import random\n\nimport jax\n\n\ndef run(f, x, devices, flag):\n"
            "  other = jax.pmap(f, 'i')\n"
            "  if flag:\n  " + between.replace("\n", "\n  ").rstrip(" ")
            + "    g = jax.pmap(f, 'i', devices=devices)\n"
            "    h = jax.pmap(f, 'i')\n"
            "    return g(x), h(x), other(x)\n")
  new = _converted(source)
  assert "Mesh(devices" not in new and "devices=devices" in new, new
  assert new.count("pmap_via_shard_map(f, 'i', devices=devices)") == 1, new
  assert new.count("per_device(f)") == 2, new


# qdax's tests: several sites over one device list, which a call in between receives.
SAME_DEVICES = '''\
import jax
import numpy as np


def run(devices, hand_on=lambda devices: None):
  x = np.arange(len(devices) * 2.0, dtype=np.float32).reshape(len(devices), 2)
  y = jax.pmap(lambda v: jax.lax.psum(v, "p"), axis_name="p", devices=devices)(x)

  # a comment on the second site
  y = jax.pmap(
      lambda v: v * jax.lax.axis_index("p"),
      axis_name="p",
      devices=devices,
  )(y)
  hand_on(devices)
  return jax.pmap(lambda v: v + 1, axis_name="p", devices=devices)(y)
'''


def test_sites_over_one_device_list_share_a_mesh_until_it_is_handed_on():
  new = _converted(SAME_DEVICES)
  assert new.count("jax.sharding.Mesh(devices,") == 2, new
  assert new.index("hand_on(devices)") < new.index("p_mesh = jax.sharding.Mesh(devices"), new
  assert new.count("mesh=mesh,") == 2 and new.count("mesh=p_mesh,") == 1, new
  devices = jax.devices()[::-1][:4]
  assert_trees_equal(load(SAME_DEVICES, "same_devices_legacy").run(devices),
                     load(new, "same_devices_converted").run(devices))


VALUES = '''\
import functools

import jax
from jax import pmap
import numpy as np


def apply(mapper, f, **options):
  return mapper(f, "i", **options)


def run():
  x = np.arange(16.0, dtype=np.float32).reshape(8, 2)
  mappers = [jax.pmap, jax.vmap]
  return (apply(jax.pmap, lambda v: jax.lax.psum(v, "i"))(x),
          apply(pmap, lambda v, s: v * s, in_axes=(0, None),
                static_broadcasted_argnums=(1,))(x, 3.0),
          functools.partial(pmap, axis_name="j", out_axes=None)(
              lambda v: jax.lax.pmean(v, "j"))(x),
          [m(lambda v: v + 1)(x) for m in mappers])
'''


def test_pmap_handed_around_as_a_value_becomes_pmap_via_shard_map():
  """Where pmap is a value (passed to a function, kept in a list), the support module's
  function with pmap's signature takes its place and gives legacy's results (a partial of
  pmap called on the spot is a site like any other); the `from jax import pmap` it no
  longer needs goes."""
  new, findings = rewrite(VALUES, target="experimental")
  assert "pmap(" not in new.replace("pmap_via_shard_map(", "") and "from jax import pmap" not in new
  assert new.count("pmap_via_shard_map") == 4, new  # three values and the import
  assert "per_device(lambda v: jax.lax.pmean" in new
  assert [f.severity.name for f in findings].count("ERROR") == 0, findings
  assert_trees_equal(load(VALUES, "values_legacy").run(), load(new, "values_converted").run())


# equinox's: the types of what each JAX transform returns, to recognise a transformed
# callable on any object, made by callers' code that still has jax.pmap.
TRANSFORM_TABLE = '''\
import jax

_transform_types = {
    type(transform(lambda x: x))
    for transform in (jax.jit, jax.vmap, jax.pmap)
}


def is_transformed(f, transform=jax.pmap):
  return type(f) in _transform_types or f is transform
'''
NAMED_TABLE = TRANSFORM_TABLE.replace(
    "_transform_types = {", "_TRANSFORMS = [jax.jit, jax.vmap, jax.pmap]\n_transform_types = {"
).replace("(jax.jit, jax.vmap, jax.pmap)", "_TRANSFORMS")


@pytest.mark.parametrize("source", [TRANSFORM_TABLE, NAMED_TABLE], ids=["literal", "named"])
def test_pmap_in_a_table_of_transforms_that_is_inspected_is_left_and_reported(source):
  new, findings = rewrite(source, target="experimental")
  assert new == source
  left = [f.line for f in findings if "pmap left unchanged" in f.message]
  assert len(left) == 2 and not [f for f in findings if "converted" in f.message], findings
  # Converted, the table would no longer recognise what legacy pmap returns.
  module = load(source, "transform_table")
  assert module.is_transformed(jax.pmap(lambda x: x)) and not module.is_transformed(len)
  # A table without pmap says nothing of it: its value use converts as any does. (A table
  # whose loop only runs the transforms converts too: VALUES.)
  called = source.replace("jax.vmap, jax.pmap", "jax.vmap")
  new, findings = rewrite(called, target="experimental")
  assert "transform=pmap_via_shard_map" in new and not [
      f for f in findings if f.severity.name == "ERROR"], findings


def test_pmap_via_shard_map_takes_a_negative_axis_over_no_leaf_as_legacy_did():
  """equinox's filter_pmap passes out_axes=([-k, ..., k-1], None, None) beside outputs that
  put leaves under the non-negative axes only: legacy pmap took it. A negative axis over
  a value raised there, and raises here."""
  helpers = support()
  x = np.arange(24.0, dtype=np.float32).reshape(8, 3)

  def split(v):
    return [{"a": None}, {"a": v * 2}], v.sum(), None

  axes = ([-1, 0], 0, None)
  assert_trees_equal(jax.pmap(split, out_axes=axes)(x),
                     helpers.pmap_via_shard_map(split, out_axes=axes)(x))
  for option in ("in_axes", "out_axes"):
    with pytest.raises(AssertionError):
      jax.pmap(lambda v: v * 2, **{option: -1})(x)
    with pytest.raises(ValueError, match="must be >= 0 where they map leaves: -1"):
      helpers.pmap_via_shard_map(lambda v: v * 2, **{option: -1})(x)


RUN_TIME = '''\
import jax
import numpy as np


def scaled(v, s):
  return jax.lax.psum(v * s, "i")


def ids(v):
  return v + jax.lax.axis_index("i")


def run(axes=(0, None), static=1, size=3, replicated=None):
  x = np.arange(12.0, dtype=np.float32).reshape(3, 4)  # 3 rows: 3 of the 8 devices
  add = jax.pmap(scaled, "i", in_axes=axes, static_broadcasted_argnums=static)
  counted = jax.pmap(ids, "i", axis_size=size)
  mean = jax.pmap(lambda v: jax.lax.pmean(v, "i"), "i", out_axes=replicated)
  once = add(x, 2.0)
  return (once, add(once, 2.0), add(x, 3.0), counted(x), mean(x),
          [s.device.id for s in once.addressable_shards])
'''


def test_options_known_only_at_run_time_run_as_legacy_pmap():
  """pmap_via_shard_map takes the options a site's statement cannot say: run-time
  in_axes, out_axes and static arguments (an axis_size variable is the plain form's
  mesh). Like legacy pmap, it maps as many devices as the arguments have rows (3 of 8
  here), compiles once per static value, and its outputs feed it again without a new
  compile."""
  new = _converted(RUN_TIME)
  assert new.count("pmap_via_shard_map(") == 2 and "Mesh(jax.devices()[:size]" in new, new
  legacy, legacy_compiles = _run_counting(load(RUN_TIME, "run_time_legacy"))
  ours, our_compiles = _run_counting(load(new, "run_time_converted"))
  assert_trees_equal(legacy, ours)
  assert ours[-1] == [d.id for d in jax.devices()[:3]]
  for name in ("scaled", "ids", "lambda"):
    assert (len([n for n in our_compiles if name in n])
            == len([n for n in legacy_compiles if name in n])), (legacy_compiles, our_compiles)
  assert len([n for n in legacy_compiles if "scaled" in n]) == 2, legacy_compiles


@pytest.mark.parametrize("args, options, says", [
    # legacy pmap's wording, which JAX's own pmap tests match
    ((np.ones(3), np.ones(4)), {}, "pmap got inconsistent sizes for array axes to be mapped"),
    ((np.ones(9),), {}, "requires 9 replicas, but only 8 devices are available"),
    ((np.ones(16),), {}, "requires 16 replicas, but only 8 devices are available"),
    ((np.float32(1),), {}, "its rank should be at least 1, but is only 0"),
    ((), {}, "pmap needs axis_size where no argument is mapped"),
    ((np.ones(3),), {"in_axes": -1}, "pmap axes must be >= 0 where they map leaves: -1"),
])
def test_pmap_via_shard_map_names_what_is_wrong(args, options, says):
  with pytest.raises(ValueError) as raised:
    support().pmap_via_shard_map(lambda *a: a[0], "i", **options)(*args)
  assert says in str(raised.value)


def test_pmap_bound_or_deleted_is_reported_not_rewritten():
  source = "import jax\n\njax.pmap = None\n"
  new, findings = rewrite(source, target="experimental")
  assert new == source
  assert any(f.severity.name == "ERROR" and "bound or deleted" in f.message for f in findings)


STATIC = '''\
import functools

import jax
import jax.numpy as jnp
import numpy as np


def step(state, batch, repeats, mode):
  y = state + batch
  if mode == "mean":
    y = jax.lax.pmean(y, "batch")
  for _ in range(repeats):
    y = y * 1.5
  return y, {"sum": jnp.sum(y), "mode": jnp.float32(len(mode))}


@functools.partial(jax.pmap, axis_name="i", in_axes=(0, None, 0),
                   static_broadcasted_argnums=1, donate_argnums=0)
def scaled(x, k, w):
  return jax.lax.psum(x * k, "i") + w


def run():
  n = jax.local_device_count()
  p_step = jax.pmap(step, axis_name="batch", static_broadcasted_argnums=(2, 3))
  x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
  s, aux = p_step(x, x, 2, "mean")
  s, aux = p_step(s, x, 3, "sum")
  s, aux = p_step(s, x, 3, "sum")
  kept = np.asarray(s)  # scaled donates s
  u = scaled(s, 2, x)
  u = scaled(u, 2, x)
  u = scaled(u, 2.5, x)
  quarter = jax.pmap(lambda v: v - jax.lax.axis_index("q"), axis_name="q", axis_size=n // 2)
  return kept, aux, u, quarter(x[: n // 2])
'''


def test_static_arguments_and_axis_size_in_the_plain_form():
  """static_broadcasted_argnums go to jit and to placed_on, which passes them through
  shard_map as they are (strings, loop counts); axis_size gives the mesh its first
  devices. Results are legacy's, and each site compiles once per static value, as legacy
  pmap did."""
  new = _converted(STATIC)
  assert "on_pmap_mesh" not in new and "host_local_io" not in new, new
  assert "placed_on(batch_mesh, P(\"batch\"), static_argnums=(2, 3))(" in new, new
  assert "@placed_on(i_mesh, (P(\"i\"), P(), P(\"i\")), static_argnums=(1,))" in new, new
  assert "@functools.partial(jax.jit, static_argnums=1, donate_argnums=0)" in new, new
  assert "jax.sharding.Mesh(jax.devices()[:n // 2], (\"q\",))" in new, new
  legacy, legacy_compiles = _run_counting(load(STATIC, "static_legacy"))
  ours, our_compiles = _run_counting(load(new, "static_converted"))
  assert_trees_equal(legacy, ours)
  for name in ("step", "scaled", "lambda"):
    assert (len([n for n in our_compiles if name in n])
            == len([n for n in legacy_compiles if name in n])), (legacy_compiles, our_compiles)
  assert len([n for n in legacy_compiles if "step" in n]) == 2, legacy_compiles


BOUND_METHOD = '''\
import jax
import numpy as np


class Buffer:
  def insert(self, x):
    return x * 2


class Wrapper:
  def __init__(self):
    self.buffer = Buffer()

  def insert(self, x):
    return jax.pmap(self.buffer.insert)(x)


def run():
  wrapper = Wrapper()
  x = np.ones((jax.local_device_count(), 3), np.float32)
  return [wrapper.insert(x) for _ in range(3)]
'''


def _warning_and_compiles(source: str, name: str) -> tuple[str, int, int]:
  """The report's one WARNING for ``source``, and how often legacy and the converted code
  compile the programs named ``name`` in its run() (whose results must agree)."""
  new, findings = rewrite(source, target="experimental")
  [warning] = [f.message for f in findings if f.severity.name == "WARNING"]
  legacy, legacy_compiles = _run_counting(load(source, f"{name}_legacy"))
  ours, our_compiles = _run_counting(load(new, f"{name}_converted"))
  assert_trees_equal(legacy, ours)
  return (warning, len([n for n in legacy_compiles if name in n]),
          len([n for n in our_compiles if name in n]))


def test_a_bound_method_built_on_each_call_compiles_as_often_as_legacy_and_says_so():
  """`jax.pmap(self.buffer.insert)(x)` in a method: the bound method is a new object on each
  access, so legacy pmap compiled each call too. The report does not claim otherwise."""
  warning, legacy, ours = _warning_and_compiles(BOUND_METHOD, "insert")
  assert "legacy pmap did too if self.buffer.insert is a bound method" in warning, warning
  assert legacy == ours == 3


MODULE_FUNCTION = '''\
import jax
import jax.numpy as jnp
import numpy as np


def negate(x):
  return jax.pmap(jnp.negative)(x)


def run():
  x = np.ones((jax.local_device_count(), 3), np.float32)
  return [negate(x) for _ in range(3)]
'''


def test_a_module_s_function_built_on_each_call_is_said_to_compile_where_legacy_did_not():
  """`jax.pmap(jnp.negative)(x)` in a function: the module's function is one object, whose
  compile legacy pmap reused; the converted site's new jax.jit compiles each call."""
  warning, legacy, ours = _warning_and_compiles(MODULE_FUNCTION, "negative")
  assert "where legacy pmap reused its compile of the same function" in warning, warning
  assert (legacy, ours) == (1, 3)


# evosax's reshaper: the function pmap gets is a jax.vmap made on each call.
TRANSFORM_PER_CALL = '''\
import jax
import numpy as np


def double_rows(x):
  doubled = jax.vmap(lambda row: row * 2)
  return jax.pmap(doubled)(x)


def run():
  x = np.ones((jax.local_device_count(), 2, 3), np.float32)
  return [double_rows(x) for _ in range(3)]
'''


def test_a_transform_made_on_each_call_compiles_as_often_as_legacy_and_is_not_warned():
  new, findings = rewrite(TRANSFORM_PER_CALL, target="experimental")
  assert not [f for f in findings if f.severity.name == "WARNING"], findings
  legacy, legacy_compiles = _run_counting(load(TRANSFORM_PER_CALL, "per_call_legacy"))
  ours, our_compiles = _run_counting(load(new, "per_call_converted"))
  assert_trees_equal(legacy, ours)
  counts = [len([n for n in c if "lambda" in n]) for c in (legacy_compiles, our_compiles)]
  assert counts[0] == counts[1] == 3, (legacy_compiles, our_compiles)


KEYWORDS = '''\
import functools

import jax
import numpy as np


def init(genotypes, centroids, key):
  return genotypes * centroids + jax.lax.psum(key, "p")


def step(x, scale=1.0, shift=0.0):
  return x * scale + shift


def make(centroids):
  return jax.pmap(functools.partial(init, centroids=centroids), axis_name="p")


def run():
  n = jax.local_device_count()
  g = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
  k = np.linspace(-1, 1, n * 3, dtype=np.float32).reshape(n, 3)
  f = make(np.float32(2))
  shifted = jax.pmap(step)
  return f(genotypes=g, key=k), f(g, key=k), shifted(g, shift=k)
'''


def test_arguments_no_position_takes_are_mapped_over_axis_0_as_legacy_did(monkeypatch):
  """qdax's `pmap(partial(self.init, centroids=c))(genotypes=g, key=k)`: after the
  partial's keyword, `key` is keyword-only; and a keyword after a parameter left to its
  default. Legacy pmap mapped both over axis 0; so does the converted site, on the
  support module as the codemod writes it for such a file (only what it calls)."""
  new, written = rewrite_with_support(KEYWORDS, target="experimental")
  monkeypatch.setitem(sys.modules, support_module.DEFAULT_NAME, written)
  assert_trees_equal(load(KEYWORDS, "keywords_legacy").run(),
                     load(new, "keywords_converted").run())


def test_keywords_no_position_takes_with_per_argument_axes_name_the_fix():
  # With in_axes per argument, the site's in_specs are a tuple of the positional ones:
  # such a keyword has no spec there, and the error names the argument to pass.
  source = ("import functools\n\nimport jax\nimport numpy as np\n\n\n"
            "def run():\n  n = jax.local_device_count()\n"
            "  f = jax.pmap(functools.partial(lambda g, c, key: g * c + key, c=2.0),\n"
            "               in_axes=(0,))\n"
            "  return f(np.ones((n, 3)), key=np.ones((n, 3)))\n")
  assert load(source, "keywords_axes_legacy").run().shape[1:] == (3,)
  with pytest.raises(TypeError, match="pass key by position"):
    load(_converted(source), "keywords_axes_converted").run()


LONG_SPECS = '''\
import functools

import jax
import numpy as np


@functools.partial(jax.pmap, axis_name="batch", in_axes=(None, 0, 0, None, 0))
def mix(w, x, y, z, v):
  return w * x - y + z * v


class Trainer:

  def __init__(self):
    self.scale = jax.pmap(lambda w, x, y, z, v: w * x * y * z - v,
                          in_axes=(None, 0, 0, None, 0))

  @functools.partial(jax.pmap, axis_name="batch", in_axes=(None, None, 0, 0, 0),
                     static_broadcasted_argnums=(0,))
  def step(self, w, x, y, z):
    return w + jax.lax.pmean(x + y * z, "batch")


def run():
  n = jax.local_device_count()
  x = np.linspace(-1, 1, n * 3, dtype=np.float32).reshape(n, 3)

  @functools.partial(jax.pmap, axis_name="batch", in_axes=(0, None, 0, 0, None))
  def local(x, w, y, z, v):
    return jax.lax.psum(x, "batch") * w + y - z * v

  trainer = Trainer()
  return [mix(2.0, x, -x, 1.0, x), trainer.scale(2.0, x, x, 3.0, -x),
          trainer.step(1.5, x, x, -x), local(x, 0.5, x, x, 2.0), local(x, 0.5, x, x, 2.0)]
'''


def test_long_in_specs_are_named_once_where_the_site_is_built():
  """In_specs too long to read twice are bound to a name just before the statement that
  builds the site (after its mesh), which placed_on and shard_map both read: named after
  the def or the target, private at module level. Results and compiles are legacy's."""
  new = _converted(LONG_SPECS)
  named = {line.split(" = ")[0].strip(): line.split(" = ")[1]
           for line in new.splitlines() if "_specs = " in line}
  assert list(named) == ["_mix_specs", "_step_specs", "scale_specs", "local_specs"], new
  for name, spec in named.items():
    assert new.count(spec) == 1, (spec, new)  # written once, read by name twice
    assert new.count(f"in_specs={name}") == 1 and new.count(f", {name}") == 1, new
  assert "@placed_on(mesh, _mix_specs)" in new, new
  assert "  local_specs = " in new and "\n\n  @placed_on(mesh, local_specs)" in new, new
  legacy, legacy_compiles = _run_counting(load(LONG_SPECS, "long_specs_legacy"))
  ours, our_compiles = _run_counting(load(new, "long_specs_converted"))
  assert_trees_equal(legacy, ours)
  for name in ("mix", "step", "local", "lambda"):
    assert (len([n for n in our_compiles if name in n])
            == len([n for n in legacy_compiles if name in n])), (legacy_compiles, our_compiles)


@pytest.mark.parametrize("binding, called", [
    ("from jax.experimental import shard_map", "shard_map.shard_map("),
    ("def shard_map(x):\n  return x", "experimental_shard_map("),
])
def test_a_file_binding_shard_map_keeps_its_binding(binding, called):
  """Where the file binds ``shard_map`` to something other than jax.experimental's
  function, the sites reach it through the module the file binds, else under a name of
  their own: the file's ``shard_map`` keeps what it was. Results are legacy's."""
  source = (f"import jax\nimport numpy as np\n\n{binding}\n\n\n"
            "def run():\n  x = np.arange(jax.local_device_count() * 2.0).reshape(-1, 2)\n"
            "  return jax.pmap(lambda v: jax.lax.psum(v, 'i'), 'i')(x), shard_map\n")
  new = _converted(source)
  assert called in new and new.count(binding) == 1, new
  assert "from jax.experimental.shard_map import shard_map\n" not in new, new
  if called.startswith("experimental"):
    assert ("from jax.experimental.shard_map import shard_map as experimental_shard_map"
            in new), new
  (legacy, bound), (ours, kept) = load(source, "bound_legacy").run(), load(new, "bound_ours").run()
  assert_trees_equal(legacy, ours)
  # The module, or the file's own def (not jax's function of that name).
  assert type(kept) is type(bound) and kept.__name__ == bound.__name__
  assert getattr(kept, "__module__", "bound_ours") == "bound_ours"


@pytest.mark.parametrize("binding", ["def per_device(x):\n  return x\n\n\n",
                                     "placed_on = print\n\n\n"])
def test_a_file_binding_a_support_name_keeps_its_site_and_says_so(binding):
  """The import of ``per_device`` / ``placed_on`` would hide the file's own (or a
  parameter would hide the import): the site stays pmap, and the report names the one
  to rename."""
  source = f"import jax\n\n\n{binding}def run(x):\n  return jax.pmap(abs)(x)\n"
  new, findings = rewrite(source, target="experimental")
  assert new == source
  name = binding.split("(")[0].split(" ")[-1] if binding.startswith("def") else "placed_on"
  [error] = [f.message for f in findings if f.severity.name == "ERROR"]
  assert error == (f"pmap left unchanged: the file binds {name}, which the converted site "
                   "would call from the support module: rename it, then rerun"), findings
  local = "def run(x, per_device=1):\n  return jax.pmap(abs)(x) * per_device\n"
  assert rewrite(f"import jax\n\n\n{local}", target="experimental")[0].endswith(local)
