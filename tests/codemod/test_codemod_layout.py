"""Rule: converted code follows the file's style: no added line beyond the file's limit,
the indentation of the block it sits in, no staircase of calls at one indent, and the
limit read from the project's configuration (``codemod.file_style``)."""
import difflib
import os
import pathlib
import textwrap

import pytest

from codemod import file_style
from codemod_testing import rewrite

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "examples").glob("*.py"),
                  *(ROOT / "tests" / "codemod" / "fixtures").glob("*.py")])


def _added(before: str, after: str) -> list[str]:
  return [line[1:] for line in difflib.unified_diff(before.splitlines(), after.splitlines(),
                                                    lineterm="", n=0)
          if line.startswith("+") and not line.startswith("+++")]


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
@pytest.mark.parametrize("width", [80, 100])
def test_no_added_line_beyond_the_files_limit(path, width, tmp_path):
  # The same file under a project whose configuration says `width`.
  (tmp_path / "setup.cfg").write_text(f"[flake8]\nmax-line-length = {width}\n")
  (tmp_path / ".git").mkdir()
  target = tmp_path / path.name
  before = path.read_text()
  target.write_text(before)
  from codemod.runner import Options, transform_file
  result = transform_file(str(target), Options())
  assert result.new_source is not None
  after = result.new_source.decode()
  # A line copied from the old site keeps its length, and so does user code that followed
  # the site on an over-long line (``pmap(f)(long arguments)``); every other added line fits.
  old_lines = {line.strip() for line in before.splitlines()}
  old_long = [line for line in before.splitlines() if len(line) > width]

  def users_overflow(line: str) -> bool:
    return any(len(line) - len(os.path.commonprefix([line[::-1], old[::-1]])) <= width
               for old in old_long)

  long = [line for line in _added(before, after)
          if len(line) > width and line.strip() not in old_lines and not users_overflow(line)]
  assert not long, "\n".join(long)


def test_limit_comes_from_the_nearest_configuration(tmp_path):
  (tmp_path / ".git").mkdir()
  (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 120\n")
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "setup.cfg").write_text("[yapf]\ncolumn_limit = 79\n")
  (tmp_path / "pkg" / "sub").mkdir()
  assert file_style.configured_width(str(tmp_path / "pkg" / "sub" / "m.py")) == 79
  assert file_style.configured_width(str(tmp_path / "other.py")) == 120
  (tmp_path / "pylintrc").write_text("[FORMAT]\nmax-line-length=99\n")
  os.remove(tmp_path / "pyproject.toml")
  assert file_style.configured_width(str(tmp_path / "m.py")) == 99


def test_without_configuration_the_files_own_lines_set_the_limit():
  short = "x = 1\n" * 10
  assert file_style.width_from_text(short) == 80
  wide = "".join(f"value_{i} = {'a' * 90!r}\n" for i in range(5))
  assert file_style.width_from_text(wide) == len(f"value_0 = {'a' * 90!r}")


def test_style_of_a_two_space_single_quoted_file():
  source = textwrap.dedent("""\
      def f(x):
        if x:
          return g(
              'a', 'b')
      """)
  style = file_style.detect(source)
  assert (style.unit, style.hang, style.quote) == ("  ", "    ", "'")


JAXLINE = '''\
import jax


class Experiment:

  def __init__(self, mode, config):
    if mode == "train":
      for _ in range(1):
        self._update_func = jax.pmap(self._update_func_impl, axis_name="i",
                                     donate_argnums=(0, 1, 2), static_broadcasted_argnums=3)
        self._eval = jax.pmap(
            functools.partial(
                self._eval_batch,
                config=config),
            axis_name="i")
'''


def test_indentation_is_kept_inside_deeply_nested_bodies():
  after, _ = rewrite(JAXLINE)
  body = after[after.index("      for _ in range(1):"):].splitlines()[1:]
  assert body, after
  # Every line of the converted statements sits inside the for loop's body.
  assert all(line.startswith(" " * 8) for line in body if line.strip()), after
  compile(after, "jaxline", "exec")
  # The user's multi-line function keeps its shape, moved as one piece: its lines hang
  # from where it now starts (inside per_device(...)).
  lines = after.splitlines()
  start = next(i for i, line in enumerate(lines) if line.endswith("functools.partial("))
  indent = lines[start].index("functools.partial(")
  assert lines[start].strip().startswith("jax.jit(shard_map(per_device(functools.partial("), after
  assert lines[start + 1] == " " * (indent + 4) + "self._eval_batch,"
  assert lines[start + 2] == " " * (indent + 4) + "config=config)),"


def test_no_staircase_of_calls_at_one_indent():
  # numpyro's mcmc.py shape: a call whose arguments do not fit the line.
  source = textwrap.dedent('''\
      import jax

      class MCMC:
        def run(self):
          if self.chain_method == "parallel":
            self._cache[key] = jax.pmap(partial_map_fn, axis_name="chains", in_axes=(0, None))
      ''')
  after, _ = rewrite(source)
  lines = after.splitlines()
  openers = [line for line in lines if line.rstrip().endswith("(")]
  # No two lines that only open a call start at the same column (a staircase).
  columns = [len(line) - len(line.lstrip()) for line in openers]
  assert len(columns) == len(set(columns)), after
  assert max(len(line) for line in lines) <= 88, after


LONG_LAMBDA = "lambda y: y * 2 + some_really_long_name_for_a_constant_value_here"


def _hanging(after: str, opener: str) -> list[str]:
  """The lines after the one ending in ``opener`` up to the statement's end."""
  lines = after.splitlines()
  start = next(i for i, line in enumerate(lines) if line.endswith(opener))
  return [line for line in lines[start + 1:] if line.strip()]


def test_a_site_after_a_multi_line_string_hangs_from_its_statements_indentation():
  # The site's line starts inside the string: its own leading blanks are the string's.
  source = ('import jax\n\n\nclass T:\n  def setUp(self):\n    self.doc = ("""\n  text\n'
            f'""", jax.pmap({LONG_LAMBDA}, axis_name="batch", donate_argnums=(0,)))\n')
  after, _ = rewrite(source)
  compile(after, "strings", "exec")
  continued = _hanging(after, '""", placed_on(mesh, P("batch"))(')
  # One continuation indent (4) deeper than the `self.doc = (` line (4).
  assert continued and all(line.startswith(" " * 8) for line in continued), after


@pytest.mark.parametrize("separator", ["\x0c", "\u2028"])
def test_line_breaks_python_does_not_make_leave_positions_as_libcst_reads_them(separator):
  # A form feed alone on a line, or U+2028 inside a string: str.splitlines breaks at
  # both, Python and libcst at neither.
  gap = "\x0c\n" if separator == "\x0c" else ""
  source = (f"import jax\n\nNOTE = 'a{separator if gap == '' else ''}b'\n{gap}\n"
            "def g(x):\n  if x is not None:\n"
            f"    return jax.pmap({LONG_LAMBDA}, axis_name='data', donate_argnums=(0,))(x)\n")
  after, findings = rewrite(source)
  assert not [f for f in findings if "internal error" in str(f)], findings
  compile(after, "breaks", "exec")
  continued = _hanging(after, "return placed_on(mesh, P('data'))(")
  # One continuation indent deeper than the `return` line (4).
  assert continued and all(line.startswith(" " * 8) for line in continued), after


def test_a_lone_copied_argument_hangs_from_its_line_as_it_did():
  # jaxline's train.py: the partial's arguments hung one indent under its old line; they
  # hang one indent under per_device's line, not under where `functools.partial(` starts.
  source = textwrap.dedent('''\
      import functools

      import jax


      def run(eval_rng, host_id_devices, config, utils):
        eval_rng = jax.pmap(functools.partial(
            utils.specialize_rng_host_device, axis_name="i",
            mode=config.random_mode_eval), axis_name="i")(eval_rng, host_id_devices)
        return eval_rng
      ''')
  after, _ = rewrite(source, target="jax")
  compile(after, "copied", "exec")
  lines = after.splitlines()
  at = next(i for i, line in enumerate(lines) if line.endswith("per_device(functools.partial("))
  indent = len(lines[at]) - len(lines[at].lstrip())
  assert lines[at + 1] == " " * (indent + 4) + 'utils.specialize_rng_host_device, axis_name="i",'
  assert lines[at + 2] == " " * (indent + 4) + "mode=config.random_mode_eval)),", after
