"""Rule: in a file with converted pmap sites, Flax's ``replicate`` and
``jax.device_put_replicated`` whose values are passed to converted sites that map them
under one axis name become the support module's ``device_put_replicated(...,
axis_name=...)``, which lays them out as those sites lay out their outputs (so the site's
jit compiles once: tests/codemod/test_codemod_constants_compiles.py and the Flax ImageNet
loop in tests/real_programs); anything else stays as written."""
import textwrap

from codemod_testing import PmapCodemodTest, rewrite

HEAD = """\
import functools

import jax
from jax.experimental.shard_map import shard_map
from jax.sharding import PartitionSpec as P
"""


def _site(name, axis, in_axes=""):
  before = f"""\
@functools.partial(jax.pmap, axis_name="{axis}"{in_axes})
def {name}(state, batch):
  return state, batch * 2
"""
  return before


def _after(name, specs):
  return f"""\
@jax.jit
@on_pmap_mesh(functools.partial(shard_map, {specs}),
              drop_device_axis=True)
def {name}(state, batch):
  return state, batch * 2
"""


STEP_BEFORE = _site("step", "batch")
STEP_AFTER = _after("step", """in_specs=P("batch"),
                                out_specs=P("batch"), check_rep=False""")


class ReplicaLayoutTest(PmapCodemodTest):

  def _converts(self, imports, body_before, body_after, *, support, sites=STEP_BEFORE,
                sites_after=STEP_AFTER, kept_import=None):
    imports = f"{imports}\n" if imports else ""
    before = f"import functools\n\nimport jax\n{imports}\n\n{sites}\n\n{body_before}"
    head = HEAD
    if kept_import is not None:
      head = head.replace("import jax\n", f"import jax\n{kept_import}\n", 1)
    after = f"{head}\nfrom pmap_shard_map import {support}\n\n\n{sites_after}\n\n{body_after}"
    self.assertCodemod(before, after)
    again, _ = rewrite(after)
    self.assertEqual(again, after, "a second run changed the output")

  def test_flax_replicate_of_a_step_input_takes_the_step_axis(self):
    # The Flax examples' loop; the flax import, used by nothing else, goes.
    self._converts("from flax import jax_utils", """\
def train(state, batches):
  state = jax_utils.replicate(state)
  for batch in batches:
    state, loss = step(state, batch)
  return state
""", """\
def train(state, batches):
  state = device_put_replicated(state, axis_name="batch")
  for batch in batches:
    state, loss = step(state, batch)
  return state
""", support="device_put_replicated, on_pmap_mesh")

  def test_device_put_replicated_keeps_its_devices_and_alignment(self):
    # Continuation lines aligned with the parenthesis move with it; a direct argument.
    self._converts("", """\
def train(state, batch):
  state = jax.device_put_replicated({"step": 0, "w": state},
                                    jax.local_devices())
  step(jax.device_put_replicated(batch, jax.devices()), batch)
  return step(state, batch)
""", """\
def train(state, batch):
  state = device_put_replicated({"step": 0, "w": state},
                                jax.local_devices(), axis_name="batch")
  step(device_put_replicated(batch, jax.devices(), axis_name="batch"), batch)
  return step(state, batch)
""", support="device_put_replicated, on_pmap_mesh")

  def test_one_argument_per_line_with_a_trailing_comma(self):
    self._converts("import flax", """\
def train(state, batch):
  state = flax.jax_utils.replicate(
      state,
  )
  return step(state, batch)
""", """\
def train(state, batch):
  state = device_put_replicated(
      state,
      axis_name="batch",
  )
  return step(state, batch)
""", support="device_put_replicated, on_pmap_mesh", kept_import="import flax")

  def test_values_for_no_site_or_for_sites_that_disagree_stay(self):
    sites = STEP_BEFORE + "\n\n" + _site("other", "x") + "\n\n" + _site(
        "broadcast", "batch", ", in_axes=(None, 0)")
    sites_after = STEP_AFTER + "\n\n" + _after("other", """in_specs=P("x"), out_specs=P("x"),
                                check_rep=False""") + "\n\n" + _after(
        "broadcast", """in_specs=(P(), P("batch")),
                                out_specs=P("batch"), check_rep=False""")
    body = """\
def train(state, batch, log):
  kept = jax_utils.replicate(state)
  log(kept)
  both = jax_utils.replicate(state)
  step(both, batch), other(both, batch)
  unmapped = jax_utils.replicate(state)
  return broadcast(unmapped, batch)
"""
    self._converts("from flax import jax_utils", body, body, support="on_pmap_mesh",
                   sites=sites, sites_after=sites_after,
                   kept_import="from flax import jax_utils")

  def _reported(self, imports, body, kept, reason):
    """``body`` (after STEP_BEFORE) converted with its replicate call kept and reported."""
    new, findings = rewrite(f"import functools\n\nimport jax\n{imports}\n\n{STEP_BEFORE}\n\n"
                            + textwrap.dedent(body))
    self.assertIn(kept, new)
    self.assertTrue(any(f"not rewritten: {reason}" in f.message for f in findings), findings)

  def test_the_name_bound_to_something_else_is_reported_not_shadowed(self):
    self._reported("from flax import jax_utils\nfrom mylib import device_put_replicated", """\
    def train(state, batch):
      state = jax_utils.replicate(device_put_replicated(state))
      return step(state, batch)
    """, "state = jax_utils.replicate(device_put_replicated(state))",
                   "the name device_put_replicated is bound to something else here")

  def test_a_break_before_the_closing_parenthesis_stays_after_the_new_keyword(self):
    self._converts("from flax import jax_utils", """\
def train(state, batch):
  state = jax_utils.replicate(
      state
  )
  return step(state, batch)
""", """\
def train(state, batch):
  state = device_put_replicated(
      state, axis_name="batch"
  )
  return step(state, batch)
""", support="device_put_replicated, on_pmap_mesh")

  def test_a_call_holding_comments_is_reported_not_rewritten(self):
    self._reported("from flax import jax_utils", """\
    def train(state, batch):
      state = jax_utils.replicate(
          state,  # the whole train state
      )
      return step(state, batch)
    """, "  state = jax_utils.replicate(\n      state,  # the whole train state\n  )",
                   "comments inside the call")

  def test_with_target_jax_the_jax_import_gives_way(self):
    # --target jax replaces JAX's device_put_replicated with the support module's: the
    # name JAX's import held is the support's now, so the call is laid out too.
    source = f"import functools\n\nimport jax\nfrom jax import device_put_replicated\n\n\n" \
        f"{STEP_BEFORE}\n\n" + textwrap.dedent("""\
    def train(state, batch):
      state = device_put_replicated(state, jax.local_devices())
      return step(state, batch)
    """)
    new, _ = rewrite(source, target="jax")
    self.assertIn('state = device_put_replicated(state, jax.local_devices(), axis_name="batch")',
                  new)
    self.assertNotIn("from jax import device_put_replicated", new)
    self.assertIn("from pmap_shard_map import device_put_replicated, on_pmap_mesh", new)

  def test_a_module_alias_made_by_assignment_is_followed(self):
    # ``ju = flax.jax_utils`` below the function using it, as import forms are followed.
    self._converts("import flax", """\
def train(state, batch):
  state = ju.replicate(state)
  state, loss = step(state, batch)
  return ju.unreplicate(state)


ju = flax.jax_utils
""", """\
def train(state, batch):
  state = device_put_replicated(state, axis_name="batch")
  state, loss = step(state, batch)
  return first_rows(state)


ju = flax.jax_utils
""", support="device_put_replicated, first_rows, on_pmap_mesh", kept_import="import flax")

  def test_row_zero_of_values_laid_out_on_the_mesh_is_read_from_its_device(self):
    # Laid out on the site's mesh, device_put_replicated's x[0] would be a gather too.
    self._converts("", """\
def train(state, batch):
  state = jax.device_put_replicated(state, jax.local_devices())
  first = state[0]
  state, loss = step(state, batch)
  return first, state[0]
""", """\
def train(state, batch):
  state = device_put_replicated(state, jax.local_devices(), axis_name="batch")
  first = first_row(state)
  state, loss = step(state, batch)
  return first, first_row(state)
""", support="device_put_replicated, first_row, on_pmap_mesh")
