"""Rule: in a file with converted pmap sites, x[0] taken of their outputs (Flax's
unreplicate, ``tree_map(lambda x: x[0], ...)``, ``out[0]`` where every binding of
``out`` that may reach it is a site's output) becomes the support module's ``first_row``;
only the rewritten nodes change, and what cannot be rewritten cleanly stays as it is,
reported as before."""
import textwrap

from codemod_testing import PmapCodemodTest, rewrite

HEAD = """\
import functools

import jax
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P
"""

HEAD_WITHOUT_FUNCTOOLS = HEAD.replace("import functools\n\n", "")

STEP_BEFORE = """\
@functools.partial(jax.pmap, axis_name="i")
def step(state, batch):
  return state, batch * 2
"""

STEP_AFTER = """\
mesh = jax.sharding.Mesh(jax.devices(), ("i",))


@placed_on(mesh, P("i"))
@jax.jit
@functools.partial(shard_map, mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                   check_rep=False)
@per_device
def step(state, batch):
  return state, batch * 2
"""


def _infos(source, **options):
  _, findings = rewrite(textwrap.dedent(source), **options)
  return [(f.line, f.message) for f in findings if "pmap converted" not in f.message]


class UnreplicateRewriteTest(PmapCodemodTest):

  def _converts(self, imports, body_before, body_after, *,
                support="first_rows, per_device, placed_on",
                target="experimental", kept_import=None, step_mesh="mesh"):
    imports = f"{imports}\n" if imports else ""
    before = f"import functools\n\nimport jax\n{imports}\n\n{STEP_BEFORE}\n\n{body_before}"
    head = HEAD if target == "experimental" else HEAD.replace(
        "from jax.experimental.shard_map import shard_map\n", "")
    step = STEP_AFTER if target == "experimental" else STEP_AFTER.replace(
        """functools.partial(shard_map, mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                   check_rep=False)""",
        """functools.partial(jax.shard_map, mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                   check_vma=False)""")
    # A file whose sites use several axis names names each mesh after its axis.
    step = step.replace("mesh = ", f"{step_mesh} = ").replace("(mesh, ", f"({step_mesh}, ")
    step = step.replace("mesh=mesh", f"mesh={step_mesh}")
    if kept_import is not None:  # stays where it was, after `import jax`
      head = head.replace("import jax\n", f"import jax\n{kept_import}\n", 1)
    after = f"{head}\nfrom pmap_shard_map import {support}\n\n\n{step}\n\n{body_after}"
    self.assertCodemod(before, after, target=target)
    again, _ = rewrite(after, target=target)
    self.assertEqual(again, after, "a second run changed the output")

  def test_flax_unreplicate_from_jax_utils(self):
    self._converts("from flax import jax_utils", """\
def run(state, batch):
  state, _ = step(state, batch)
  return jax_utils.unreplicate(state)  # one copy
""", """\
def run(state, batch):
  state, _ = step(state, batch)
  return first_rows(state)  # one copy
""")

  def test_flax_unreplicate_imported_by_name_or_through_flax(self):
    self._converts("from flax.jax_utils import unreplicate", """\
def run(state):
  return unreplicate(step(state, state))
""", """\
def run(state):
  return first_rows(step(state, state))
""")
    self._converts("import flax.jax_utils", """\
def run(state):
  state = step(state, state)
  return flax.jax_utils.unreplicate(
      state)
""", """\
def run(state):
  state = step(state, state)
  return first_rows(
      state)
""")

  def test_flax_import_still_used_elsewhere_stays(self):
    self._converts("from flax import jax_utils", """\
def run(state):
  return jax_utils.unreplicate(jax_utils.replicate(state))
""", """\
def run(state):
  return first_rows(jax_utils.replicate(state))
""", kept_import="from flax import jax_utils")

  def test_tree_map_lambdas(self):
    # f(lambda x: x[0], tree) is first_rows(tree); with more arguments only the lambda goes.
    self._converts("", """\
def run(state, batch):
  state, metrics = step(state, batch)
  a = jax.tree.map(lambda x: x[0], metrics)
  b = jax.tree_util.tree_map(lambda leaf: leaf[0], state, is_leaf=None)
  c = jax.tree_util.tree_map(f=lambda y: y[0], tree=state)
  d = jax.tree_util.tree_map(
      lambda x: x[0],  # device 0
      state)
  return a, b, c, d
""", """\
def run(state, batch):
  state, metrics = step(state, batch)
  a = first_rows(metrics)
  b = jax.tree_util.tree_map(first_row, state, is_leaf=None)
  c = jax.tree_util.tree_map(f=first_row, tree=state)
  d = jax.tree_util.tree_map(
      first_row,  # device 0
      state)
  return a, b, c, d
""", support="first_row, first_rows, per_device, placed_on")

  def test_jax_tree_map_per_target(self):
    # --target jax renames jax.tree_map where the lambda alone is rewritten.
    for target in ("experimental", "jax"):
      self._converts("", "def run(s):\n  return jax.tree_map(lambda x: x[0], step(s, s))\n",
                     "def run(s):\n  return first_rows(step(s, s))\n", target=target)
    self._converts("", "def run(s):\n  s = step(s, s)\n"
                   "  return jax.tree_map(lambda x: x[0], s, is_leaf=None)\n",
                   "def run(s):\n  s = step(s, s)\n"
                   "  return jax.tree.map(first_row, s, is_leaf=None)\n",
                   target="jax", support="first_row, per_device, placed_on")

  def test_outputs_of_a_converted_site(self):
    self._converts("", """\
p_double = jax.pmap(lambda x: x * 2)


def run(state, batch):
  losses = []
  for _ in range(3):
    state, loss = step(state, batch)
    losses.append(loss[0])  # device 0's loss
  out = p_double(batch)
  return (losses, out[0], step(state, batch)[0],
          p_double(out)[0])
""", """\
p_double = placed_on(mesh, P("i"))(
    jax.jit(shard_map(per_device(lambda x: x * 2), mesh=mesh, in_specs=P("i"),
                      out_specs=P("i"), check_rep=False)))


def run(state, batch):
  losses = []
  for _ in range(3):
    state, loss = step(state, batch)
    losses.append(first_row(loss))  # device 0's loss
  out = p_double(batch)
  return (losses, first_row(out), first_row(step(state, batch)),
          first_row(p_double(out)))
""", support="first_row, per_device, placed_on")

  def test_attributes_of_outputs_and_replicated_values(self):
    # A Flax TrainState's fields, of a site's output or of jax_utils.replicate's, as the
    # Flax examples' loops hold them (a parameter, then a created state, replicated, then
    # the step's outputs); an array's metadata (out.shape[0]) is not a row and stays, nor
    # does a field's [0] indexed again (most likely a tuple field's element: brax's
    # normalizer_params[0][0]).
    self._converts("from flax import jax_utils", """\
def run(state, batch, make_state):
  state = make_state(state)
  state = jax_utils.replicate(state)
  start = int(state.step[0])
  state, metrics = step(state, batch)
  return (start, state.params.kernel[0], metrics.shape[0],
          jax_utils.replicate(batch).x[0], state.stats[0][0])
""", """\
def run(state, batch, make_state):
  state = make_state(state)
  state = jax_utils.replicate(state)
  start = int(first_row(state.step))
  state, metrics = step(state, batch)
  return (start, first_row(state.params.kernel), metrics.shape[0],
          first_row(jax_utils.replicate(batch).x), state.stats[0][0])
""", support="first_row, per_device, placed_on", kept_import="from flax import jax_utils")

  def test_helpers_that_only_return_outputs(self):
    # The file's own replicate (and a function returning what a site returns) makes
    # outputs as what it returns does; one that may return something else, or fall off its
    # end, does not.
    helpers = """\
def replicate(tree):
  return jax.device_put_replicated(tree, jax.local_devices())


def _train(state, batch):
  if batch is None:
    return step(state, state)
  return step(state, batch)


def _maybe(state, batch):
  if batch is not None:
    return step(state, batch)


def run(state, batch):
  state = replicate(state)
"""
    self._converts("", helpers + """\
  first = state[0]
  return first, _train(state, batch)[0], _maybe(state, batch)[0]
""", helpers + """\
  first = first_row(state)
  return first, first_row(_train(state, batch)), _maybe(state, batch)[0]
""", support="first_row, per_device, placed_on")

  def _stays(self, body):
    self._converts("", body, body, support="per_device, placed_on")

  def test_values_not_provably_outputs_stay(self):
    self._stays("""\
def run(state, batch, other, f):
  state, loss = step(state, batch)
  mixed = loss
  mixed = other
  loss2 = step(state, batch)
  loss2 += 1
  out = step(state, batch)
  out[0] = batch
  return other[0], mixed[0], loss2[0], loss[1], loss[0, 1], out, other.step[0], f(out)[0]
""")

  # Which bindings reach the x[0] decides, not which ones the name has somewhere.

  def test_pgx_tuple_indexed_before_the_name_holds_outputs_stays(self):
    # pgx's alphazero: model[0] indexes init's (params, state) tuple; model only holds
    # replicated values and the site's outputs further down.
    before = """\
import jax

train = jax.pmap(lambda model, opt_state, batch: (model, opt_state, batch), axis_name="i")


def main(forward, optimizer, rng, dummy_state, devices, batches):
    model = forward.init(rng, dummy_state.observation)  # (params, state)
    opt_state = optimizer.init(params=model[0])
    model, opt_state = jax.device_put_replicated((model, opt_state), devices)
    for batch in batches:
        model, opt_state, loss = train(model, opt_state, batch)
    return model[0], loss[0]
"""
    after = f"""\
{HEAD_WITHOUT_FUNCTOOLS}from pmap_shard_map import first_row, per_device, placed_on

mesh = jax.sharding.Mesh(jax.devices(), ("i",))
train = placed_on(mesh, P("i"))(
    jax.jit(
        shard_map(
            per_device(
                lambda model, opt_state, batch: (model, opt_state, batch)),
            mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_rep=False)))


def main(forward, optimizer, rng, dummy_state, devices, batches):
    model = forward.init(rng, dummy_state.observation)  # (params, state)
    opt_state = optimizer.init(params=model[0])
    model, opt_state = jax.device_put_replicated((model, opt_state), devices)
    for batch in batches:
        model, opt_state, loss = train(model, opt_state, batch)
    return first_row(model), first_row(loss)
"""
    self.assertConverts(before, after)  # code compared, not the imports' layout
    [(line, message)] = [i for i in _infos(before) if "model[0]" in i[1]]
    assert line == 8, line
    assert message == ("model[0] left as written: `model` may hold a value other than a "
                       "converted site's output or a replicated value here (bound at line 7)")

  def test_rebinding_after_the_use(self):
    self._converts("", """\
def run(state, batch, make):
  out = make(batch)
  first = out[0]
  rows = [batch]
  out = step(state, batch)
  rows = step(state, batch)
  return first, out[0], rows[0]
""", """\
def run(state, batch, make):
  out = make(batch)
  first = out[0]
  rows = [batch]
  out = step(state, batch)
  rows = step(state, batch)
  return first, first_row(out), first_row(rows)
""", support="first_row, per_device, placed_on")

  def test_branches(self):
    # One arm binding another call's result reaches the use; both arms binding outputs
    # (or an arm that returns) do not.
    self._converts("", """\
def run(state, batch, cond, other):
  out = step(state, batch)
  if cond:
    out = other(batch)
  both = step(state, batch)
  if cond:
    both = step(state, 1)
  elif batch:
    both = other(batch)
    both = step(both, 2)
  else:
    both = step(state, 3)
  return out[0], both[0]
""", """\
def run(state, batch, cond, other):
  out = step(state, batch)
  if cond:
    out = other(batch)
  both = step(state, batch)
  if cond:
    both = step(state, 1)
  elif batch:
    both = other(batch)
    both = step(both, 2)
  else:
    both = step(state, 3)
  return out[0], first_row(both)
""", support="first_row, per_device, placed_on")

  def test_loop_carried_site_outputs_and_a_replicated_start(self):
    # The Flax loop: the replicated state and the step's outputs reach each [0] (the
    # loop's own rebinding through the back edge); unreplicate needs no proof.
    body = """\
def train(state, batches):
  state = jax_utils.replicate(state)
  for batch in batches:
    print(state.step[0])
    state, metrics = step(state, batch)
    print(state.params[0], metrics[0])
  return jax_utils.unreplicate(state), state[0]
"""
    # Code compared, not layout. The replicated start stays as written: placed_on puts
    # it on the step's mesh.
    self.assertConverts(
        f"import functools\n\nimport jax\nfrom flax import jax_utils\n\n\n{STEP_BEFORE}\n\n"
        + body, f"{HEAD}from flax import jax_utils\nfrom pmap_shard_map import first_row, "
        f"first_rows, per_device, placed_on\n\n\n{STEP_AFTER}\n\n" + """\
def train(state, batches):
  state = jax_utils.replicate(state)
  for batch in batches:
    print(first_row(state.step))
    state, metrics = step(state, batch)
    print(first_row(state.params), first_row(metrics))
  return first_rows(state), first_row(state)
""")

  def test_loop_carried_binding_of_another_call_stays(self):
    # update's result reaches state[0] through the back edge, the first time round the
    # site's output does; after the loop, both.
    self._stays("""\
def run(state, batch, update):
  state = step(state, batch)
  firsts = []
  for _ in range(3):
    firsts.append(state[0])
    state = update(state)
  while batch:
    state, batch = step(state, batch)
    if batch:
      state = update(state)
      continue
  return firsts, state[0]
""")

  def test_tuple_of_another_call_stays(self):
    self._stays("""\
def run(state, batch, other):
  a, b = step(state, batch)
  c, d = other(batch)
  a, b = other(a)
  return a[0], b[0], c[0]
""")

  def test_parameter_reaching_stays(self):
    self._converts("", """\
def run(state, batch, cond):
  first = state[0]
  if cond:
    state, _ = step(state, batch)
  second = state[0]
  state, _ = step(state, batch)
  return first, second, state[0]
""", """\
def run(state, batch, cond):
  first = state[0]
  if cond:
    state, _ = step(state, batch)
  second = state[0]
  state, _ = step(state, batch)
  return first, second, first_row(state)
""", support="first_row, per_device, placed_on")
    infos = _infos(f"import functools\n\nimport jax\n\n\n{STEP_BEFORE}\n\n" + """\
def run(state, batch, cond):
  first = state[0]
  if cond:
    state, _ = step(state, batch)
  second = state[0]
""")
    assert infos == [(12, "state[0] left as written: `state` may hold a value other than a "
                          "converted site's output or a replicated value here (bound at line 11)"),
                     (15, "state[0] left as written: `state` may hold a value other than a "
                          "converted site's output or a replicated value here (bound at line 11)")], infos

  def test_site_output_bound_then_indexed(self):
    self._converts("", "def run(y):\n  x = step(y, y)\n  return x[0]\n",
                   "def run(y):\n  x = step(y, y)\n  return first_row(x)\n",
                   support="first_row, per_device, placed_on")

  def test_other_lambdas_and_calls_stay(self):
    self._stays("""\
def run(a, b, f):
  x = jax.tree.map(lambda x, y: x[0] + y, a, b)
  y = jax.tree.map(lambda x: x[1], a)
  z = f(lambda x: x[0], a)
  w = jax.tree.map(lambda x=a: x[0], a)
  return x, y, z, w
""")

  def test_private_helper_given_only_outputs(self):
    # A helper only this file calls, and only with outputs (brax's _unpmap): its body is
    # rewritten, the def keeps its name. Tuples, lists and dicts of outputs are outputs.
    self._converts("", """\
def _unreplicate(tree):
  return jax.tree.map(lambda x: x[0], tree)


def run(state, batch):
  state, metrics = step(state, batch)
  return _unreplicate(state), _unreplicate(tree=(metrics, {"s": state}))
""", """\
def _unreplicate(tree):
  return first_rows(tree)


def run(state, batch):
  state, metrics = step(state, batch)
  return _unreplicate(state), _unreplicate(tree=(metrics, {"s": state}))
""")

  def test_nested_helper_given_only_outputs(self):
    self._converts("", """\
def run(state, batch):
  def unreplicate(tree, index):
    return jax.tree.map(lambda x: x[0], tree), index[0]
  state, metrics = step(state, batch)
  return unreplicate(state, [1]), unreplicate(metrics, [2])
""", """\
def run(state, batch):
  def unreplicate(tree, index):
    return first_rows(tree), index[0]
  state, metrics = step(state, batch)
  return unreplicate(state, [1]), unreplicate(metrics, [2])
""")


  def test_tree_forms_of_values_not_provably_outputs_stay(self):
    # The tree forms read row 0 of values the file shows to be outputs, as x[0] does: a
    # parameter of a function other modules may call, or given a value that is not an
    # output by one of its calls, or a helper passed on as a value, stays as written.
    self._stays("""\
def unreplicate(tree):
  return jax.tree.map(lambda x: x[0], tree)


def _rows(tree):
  return jax.tree.map(lambda x: x[0], tree, is_leaf=None)


def _first(tree):
  return jax.tree.map(lambda x: x[0], tree)


def run(state, batch, init):
  model = init(batch)  # (params, state)
  host = jax.tree.map(lambda x: x[0], model)
  model = step(state, batch)
  return (unreplicate(model), _rows(model), _rows(init), list(map(_first, [model])),
          host)
""")
    infos = _infos(f"import functools\n\nimport jax\n\n\n{STEP_BEFORE}\n\n"
                   "def run(init, batch):\n  return jax.tree.map(lambda x: x[0], init(batch))\n")
    assert infos[-1][1].endswith("(not rewritten: `init(batch)` is not shown to be a converted "
                                 "site's output or a replicated value here)"), infos


class NotRewrittenTest(PmapCodemodTest):

  def test_file_without_converted_sites_is_only_reported(self):
    source = """\
import jax
from flax import jax_utils

a = jax_utils.unreplicate(state)
b = jax.tree.map(lambda x: x[0], metrics)
"""
    self.assertUnchanged(source)
    assert [l for l, m in _infos(source) if "out_axes=None" in m] == [4, 5]

  def test_support_name_bound_to_something_else(self):
    # The file's own first_row: the [0] stays (reported), first_rows is still free.
    source = """\
import jax

step = jax.pmap(lambda x: x)


def first_row(x):
  return x


def run(s):
  return jax.tree.map(lambda x: x[0], step(s)), step(s)[0]
"""
    new, _ = rewrite(source)
    assert new.endswith("def run(s):\n  return first_rows(step(s)), step(s)[0]\n")
    infos = _infos(source)
    assert [l for l, _ in infos] == [11, 11], infos
    assert infos[1][1].endswith(
        "(not rewritten: the name first_row is bound to something else here)")
    # The file's own first_rows: the tree map's lambda alone becomes first_row.
    new, _ = rewrite(source.replace("def first_row(", "def first_rows("))
    assert new.endswith(
        "def run(s):\n  return jax.tree.map(first_row, step(s)), first_row(step(s))\n")

  def test_line_limit(self):
    # 80 columns: `first_row(...)` would overflow this line, the lambda form never does.
    long_name = "o" * 62
    source = f"""\
import jax

step = jax.pmap(lambda x: x)


def run(s):
  {long_name} = step(s)
  return {long_name}[0]
"""
    new, findings = rewrite(source)
    assert f"return {long_name}[0]" in new
    [message] = [f.message for f in findings if "not rewritten" in f.message]
    assert "longer than the file's limit (80)" in message

  def test_flax_import_with_a_comment_is_kept(self):
    # Removing the unused import would drop the comment above it with it.
    new, _ = rewrite("""\
import jax
# Flax's helpers.
from flax import jax_utils

step = jax.pmap(lambda x: x)
print(jax_utils.unreplicate(step(1)))
""")
    assert new.startswith("import jax\n# Flax's helpers.\nfrom flax import jax_utils\n")
    assert new.endswith("print(first_rows(step(1)))\n")


def test_findings_name_the_rewrite():
  infos = _infos("""\
import jax
from flax import jax_utils

step = jax.pmap(lambda x: x)
a = jax_utils.unreplicate(step(1))
b = jax.tree.map(lambda x: x[0], step(1))
c = step(1)[0]
d = jax.tree.map(lambda x: x[0], step(1), is_leaf=None)
""")
  assert [l for l, _ in infos] == [5, 6, 7, 8]
  assert "flax.jax_utils.unreplicate rewritten to first_rows," in infos[0][1]
  assert "a tree map of lambda x: x[0] rewritten to first_rows(...)" in infos[1][1]
  assert "[0] of a converted pmap site's output rewritten to first_row(...)" in infos[2][1]
  assert "lambda x: x[0] rewritten to first_row," in infos[3][1]
  assert all("same values, dtype and shape" in m for _, m in infos)
