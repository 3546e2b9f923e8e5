"""Rule: every comment at a converted site survives, next to what it described.

The corpus holds sites shaped like real code (scenic, kfac-jax, jaxline, flax, numpyro)
with comments in every position a call or decorator has: trailing an argument, on its own
line before one, after the opening parenthesis, before the closing one, after the call,
on and between decorator lines, inside argument values. Each fixture runs through the
codemod; the property is checked for all of them, and a few exact layouts are pinned.
"""
import collections
import io
import textwrap
import tokenize

import pytest

from codemod_testing import PmapCodemodTest, rewrite

CORPUS = {
    # scenic: a trailing comment on an argument that moves to jax.jit, an own-line one.
    "scenic_train_step": '''
        import functools
        import jax

        def train(train_step, flax_model):
          train_step_pmapped = jax.pmap(
              functools.partial(train_step, flax_model=flax_model),
              axis_name='batch',
              # We can donate both buffers of train_state and train_batch.
              donate_argnums=(0, 1),
          )
          eval_step_pmapped = jax.pmap(
              eval_step,
              axis_name='batch',
              static_broadcasted_argnums=(0, 1, 2),  # Task, dataset and modality args.
          )
          return train_step_pmapped, eval_step_pmapped
        ''',
    # kfac-jax: a type-checker pragma on the pmap line of a decorator partial.
    "kfac_pragma": '''
        import functools
        import jax

        @functools.partial(
            jax.pmap,  # pyrefly: ignore[bad-argument-type]
            axis_name="i",
            donate_argnums=0,
        )
        def step(x):
          return x
        ''',
    # jaxline: a method assigning a pmap with continuation lines, comments everywhere.
    "jaxline_method": '''
        import jax

        class Experiment:

          def __init__(self, mode):
            if mode == "train":
              self._update_func = jax.pmap(  # the train step
                  self._update_func_impl,  # per-device step
                  axis_name="i",
                  # state is consumed
                  donate_argnums=(0,),
                  # end of options
              )  # after the call
        ''',
    "head_and_tail_only": '''
        import jax

        g = jax.pmap(  # header
            f, "i"
            # before the close
        )
        ''',
    "in_axes_and_out_axes": '''
        import jax

        g = jax.pmap(
            f,
            axis_name="batch",  # the data axis
            in_axes=(0, None),  # params replicated
            out_axes=0,  # per-device loss
        )
        ''',
    "comment_inside_in_axes": '''
        import jax

        g = jax.pmap(f, "i", in_axes=(0,  # data
                                      None))  # params
        ''',
    "comment_inside_function": '''
        import functools
        import jax

        g = jax.pmap(
            functools.partial(
                step,  # the step
                lr=0.1,  # learning rate
            ),
            "i")
        ''',
    "decorator_line_comments": '''
        import functools
        import jax

        # Runs on every device.
        @jax.pmap  # data parallel
        def a(x):
          return x


        @functools.partial(jax.pmap, axis_name="i")  # named axis
        def b(x):
          return x


        @functools.partial(jax.pmap,  # map over devices
                           axis_name="i",
                           static_broadcasted_argnums=1)  # config is static
        def c(x, config):
          return x
        ''',
    "nested_decorators": '''
        import jax

        @jax.pmap  # outer: hosts
        # inner comes next
        @jax.pmap  # inner: devices
        def d(x):
          return x
        ''',
    "partial_then_called": '''
        import functools
        import jax

        g = functools.partial(
            jax.pmap,  # type: ignore
            axis_name="i",  # axis
        )(f)  # applied
        ''',
    "numpyro_chain_method": '''
        import jax

        class MCMC:

          def _compile(self, backend):
            if self.chain_method == "parallel":
              partial_map_fn = partial(self._single_chain_mcmc, collect_fields=self._collect_fields)
              map_fn = jax.pmap(
                  partial_map_fn,  # one chain per device
                  devices=backend,  # the chains' devices
                  axis_name="chains",
              )
              return map_fn
        ''',
    "two_trailing_on_one_argument": '''
        import jax

        g = jax.pmap(
            f,
            in_axes=0,  # mapped
            axis_name="i",  # over devices
        )
        ''',
}


def _comments(source: str) -> collections.Counter:
  tokens = tokenize.generate_tokens(io.StringIO(source).readline)
  return collections.Counter(t.string for t in tokens if t.type == tokenize.COMMENT)


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_every_comment_of_the_input_is_in_the_output(name):
  before = textwrap.dedent(CORPUS[name])
  after, findings = rewrite(before)
  assert not [f for f in findings if f.severity.value == "ERROR"], findings
  assert "jax.pmap" not in after, after
  missing = _comments(before) - _comments(after)
  assert not missing, f"lost {dict(missing)}:\n{after}"
  compile(after, name, "exec")
  again, _ = rewrite(after)
  assert again == after, "a second run changed the output"


def _line_with(text: str, comment: str) -> str:
  return next(line for line in text.splitlines() if comment in line)


@pytest.mark.parametrize("name,comment,code", [
    ("scenic_train_step", "# Task, dataset and modality args.", "static_argnums=(0, 1, 2),"),
    ("kfac_pragma", "# pyrefly: ignore[bad-argument-type]", "jax.jit,"),
    ("jaxline_method", "# per-device step", "(self._update_func_impl),"),
    ("jaxline_method", "# the train step", 'placed_on(mesh, P("i"))('),
    ("jaxline_method", "# after the call", ")"),
    ("in_axes_and_out_axes", "# params replicated", "in_specs="),
    ("in_axes_and_out_axes", "# per-device loss", "out_specs=P("),
    ("decorator_line_comments", "# config is static", ")"),
    # devices= now says which devices the mesh spans
    ("numpyro_chain_method", "# the chains' devices", "jax.sharding.Mesh(backend, "),
    ("partial_then_called", "# applied", ")"),
])
def test_trailing_comments_stay_on_the_line_of_what_they_described(name, comment, code):
  after, _ = rewrite(textwrap.dedent(CORPUS[name]))
  assert code in _line_with(after, comment), after


@pytest.mark.parametrize("name,comment,next_code", [
    ("scenic_train_step", "# We can donate both buffers", "donate_argnums=(0, 1)"),
    ("jaxline_method", "# state is consumed", "donate_argnums=(0,)"),
    ("nested_decorators", "# inner comes next", "@"),
    ("decorator_line_comments", "# Runs on every device.", "@"),
])
def test_own_line_comments_stay_before_what_they_preceded(name, comment, next_code):
  after, _ = rewrite(textwrap.dedent(CORPUS[name]))
  lines = after.splitlines()
  at = next(i for i, line in enumerate(lines) if comment in line)
  assert lines[at].strip().startswith("#"), after
  following = next(line for line in lines[at + 1:] if not line.strip().startswith("#"))
  assert next_code in following, after


class ExactLayoutTest(PmapCodemodTest):
  """Two sites as a reviewer reads them (libcst CodemodTest: before and after), in the
  plain form: one with static_broadcasted_argnums, one with donate_argnums."""

  def test_scenic_site(self):
    self.assertCodemod(textwrap.dedent('''
        import jax

        def build(eval_step):
          return jax.pmap(
              eval_step,
              axis_name='batch',
              static_broadcasted_argnums=(0, 1, 2),  # Task, dataset and modality args.
          )
        '''), textwrap.dedent('''
        import jax
        from jax.experimental.shard_map import shard_map
        from jax.sharding import PartitionSpec as P

        from pmap_shard_map import per_device, placed_on

        def build(eval_step):
          mesh = jax.sharding.Mesh(jax.devices(), ('batch',))
          return placed_on(mesh, P('batch'), static_argnums=(0, 1, 2))(
              jax.jit(
                  shard_map(per_device(eval_step), mesh=mesh, in_specs=P('batch'),
                            out_specs=P('batch'), check_rep=False),
                  static_argnums=(0, 1, 2),  # Task, dataset and modality args.
              ),
          )
        '''), target="experimental")

  def test_kfac_pragma_site(self):
    self.assertCodemod(textwrap.dedent(CORPUS["kfac_pragma"]), textwrap.dedent('''
        import functools
        import jax
        from jax.experimental.shard_map import shard_map
        from jax.sharding import PartitionSpec as P

        from pmap_shard_map import per_device, placed_on

        mesh = jax.sharding.Mesh(jax.devices(), ("i",))

        @placed_on(mesh, P("i"))
        @functools.partial(
            jax.jit,  # pyrefly: ignore[bad-argument-type]
            donate_argnums=0,
        )
        @functools.partial(shard_map, mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                           check_rep=False)
        @per_device
        def step(x):
          return x
        '''), target="experimental")


def test_comments_of_a_run_of_decorators_keep_their_order():
  after, _ = rewrite(textwrap.dedent(CORPUS["nested_decorators"]))
  order = [c for c in ("# outer: hosts", "# inner comes next", "# inner: devices")]
  found = sorted(order, key=after.index)
  # The first decorator keeps its comment, at its end; the others come before, in source
  # order.
  lines = after.splitlines()
  first = next(i for i, line in enumerate(lines) if line.startswith("@"))
  ends_first = next(i for i, line in enumerate(lines) if "# outer: hosts" in line)
  assert lines[first].startswith("@functools.partial(host_local_io,"), after
  assert first <= ends_first < lines.index("@jax.jit"), after
  assert lines[ends_first].endswith(")  # outer: hosts"), after
  assert found[:2] == ["# inner comes next", "# inner: devices"], after
  assert after.index("# inner: devices") < after.index("@"), after


@pytest.mark.parametrize("pragma", ["# type: ignore", "# type: ignore[return-value]",
                                    "# pytype: disable=bad-return-type",
                                    "# pylint: disable=not-callable",
                                    "# pyright: ignore"])
def test_a_checker_s_comment_goes_to_the_first_line_of_the_statement_it_ended(pragma):
  # mypy, pytype and pylint read it on the first line of a statement that spans several
  # (qdax's `return jax.pmap(update_fn, devices=devices, axis_name="p")  # type: ignore`).
  before = textwrap.dedent(f'''\
      import jax


      def get_update_fn(update_fn, devices):
        return jax.pmap(update_fn, devices=devices, axis_name="p")  {pragma}
      ''')
  after, _ = rewrite(before, target="experimental")
  statement = after[after.index("  return "):]
  first, rest = statement.split("\n", 1)
  assert first.endswith("(  " + pragma), after
  assert "#" not in rest, after
  assert max(len(line) for line in after.splitlines()) <= 80, after


def test_an_ordinary_comment_that_ended_the_line_stays_at_the_end():
  before = textwrap.dedent('''\
      import jax


      def get_update_fn(update_fn, devices):
        return jax.pmap(update_fn, devices=devices, axis_name="p")  # the step
      ''')
  after, _ = rewrite(before, target="experimental")
  assert after.rstrip().endswith(")))  # the step"), after
