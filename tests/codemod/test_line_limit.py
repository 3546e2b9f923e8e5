"""Rule: the line limit of converted code is the one the repository configures (ruff, black,
pyink, yapf, flake8 / pycodestyle, pylint, .editorconfig), the nearest configuration
winning; without one, what the file's code reaches, never its comments, docstrings or
strings; and generated continuation lines sit where the file's formatter puts them."""
import difflib
import io
import pathlib
import subprocess
import sys
import textwrap
import tokenize

import pytest

from codemod import file_style
from codemod_testing import rewrite

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _repo(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
  """A repository holding ``files`` (path -> text) and a module ``m.py`` at its root."""
  (tmp_path / ".git").mkdir(parents=True)
  for name, text in files.items():
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(textwrap.dedent(text))
  (tmp_path / "m.py").write_text("x = 1\n")
  return tmp_path


CONFIGURATIONS = {
    "ruff": ({"pyproject.toml": "[tool.ruff]\nline-length = 100\n"}, 100),
    "ruff.toml": ({"ruff.toml": "line-length = 110\n"}, 110),
    ".ruff.toml over pyproject": ({".ruff.toml": "line-length = 90\n",
                                   "pyproject.toml": "[tool.ruff]\nline-length = 120\n"}, 90),
    "ruff default": ({"pyproject.toml": "[tool.ruff.lint]\nselect = ['E']\n"}, 88),
    "ruff extend": ({"pyproject.toml": "[tool.ruff]\nextend = 'base/ruff.toml'\n",
                     "base/ruff.toml": "line-length = 96\n"}, 96),
    "ruff pycodestyle": ({"ruff.toml": "line-length = 84\n[lint.pycodestyle]\n"
                                       "max-line-length = 120\n"}, 84),
    "black": ({"pyproject.toml": "[tool.black]\nline-length = 100\n"}, 100),
    "black default": ({"pyproject.toml": "[tool.black]\ntarget-version = ['py310']\n"}, 88),
    "pyink": ({"pyproject.toml": "[tool.pyink]\nline-length = 80\npyink-indentation = 2\n"}, 80),
    "pyink default": ({"pyproject.toml": "[tool.pyink]\npyink-indentation = 2\n"}, 88),
    "yapf pyproject": ({"pyproject.toml": "[tool.yapf]\ncolumn_limit = 100\n"}, 100),
    "yapf style file": ({".style.yapf": "[style]\nbased_on_style = pep8\ncolumn_limit = 120\n"},
                        120),
    "yapf google": ({".style.yapf": "[style]\nbased_on_style = google\n"}, 80),
    "yapf setup.cfg": ({"setup.cfg": "[yapf]\nbased_on_style = pep8\n"}, 79),
    "flake8 setup.cfg": ({"setup.cfg": "[flake8]\nmax-line-length = 120\n"}, 120),
    "flake8 tox.ini": ({"tox.ini": "[flake8]\nmax_line_length = 110\n"}, 110),
    ".flake8": ({".flake8": "[flake8]\nmax-line-length = 100\n"}, 100),
    "pycodestyle": ({"setup.cfg": "[pycodestyle]\nmax-line-length = 95\n"}, 95),
    "pylintrc": ({"pylintrc": "[FORMAT]\nmax-line-length=99  # wide\n"}, 99),
    ".pylintrc": ({".pylintrc": "[MAIN]\njobs = 2\n\n[format]\nmax-line-length = 101\n"}, 101),
    "pylint pyproject": ({"pyproject.toml": "[tool.pylint.format]\nmax-line-length = 105\n"},
                         105),
    "pylint pyproject main": ({"pyproject.toml": "[tool.pylint.main]\nmax-line-length = 97\n"},
                              97),
    "pylint setup.cfg": ({"setup.cfg": "[pylint.FORMAT]\nmax-line-length = 98\n"}, 98),
    "editorconfig": ({".editorconfig": "root = true\n[*.py]\nmax_line_length = 100\n"}, 100),
    "editorconfig star": ({".editorconfig": "[*]\nmax_line_length = 90\n"}, 90),
    "editorconfig braces": ({".editorconfig": "[*.{py,pyi}]\nmax_line_length = 92\n"}, 92),
    # A formatter decides how code is wrapped: its width comes before a linter's ceiling,
    # and any tool's setting before the editor's.
    "black over flake8": ({"pyproject.toml": "[tool.black]\nline-length = 100\n",
                           "setup.cfg": "[flake8]\nmax-line-length = 120\n"}, 100),
    "black default over flake8": ({"pyproject.toml": "[tool.black]\n",
                                   "setup.cfg": "[flake8]\nmax-line-length = 120\n"}, 88),
    "flake8 over editorconfig": ({".flake8": "[flake8]\nmax-line-length = 100\n",
                                  ".editorconfig": "[*]\nmax_line_length = 80\n"}, 100),
}


@pytest.mark.parametrize("name", sorted(CONFIGURATIONS))
def test_limit_from_each_configuration(name, tmp_path):
  files, width = CONFIGURATIONS[name]
  repo = _repo(tmp_path, files)
  # The file's own lines say otherwise: the configuration wins.
  text = "".join(f"value_{i} = {'a' * 120!r}\n" for i in range(3))
  assert file_style.detect(text, str(repo / "m.py")).width == width


def test_a_linter_without_a_limit_says_nothing(tmp_path):
  repo = _repo(tmp_path, {"pylintrc": "[MESSAGES CONTROL]\ndisable = C0114\n",
                          "setup.cfg": "[flake8]\nselect = E,W\n"})
  assert file_style.configured_width(str(repo / "m.py")) is None


def test_nearest_configuration_wins(tmp_path):
  repo = _repo(tmp_path, {"pyproject.toml": "[tool.black]\nline-length = 100\n",
                          "pkg/setup.cfg": "[flake8]\nmax-line-length = 79\n",
                          "pkg/sub/__init__.py": ""})
  assert file_style.configured_width(str(repo / "pkg" / "sub" / "m.py")) == 79
  assert file_style.configured_width(str(repo / "m.py")) == 100


def test_configuration_above_the_repository_is_not_the_projects(tmp_path):
  (tmp_path / "pyproject.toml").write_text("[tool.black]\nline-length = 120\n")
  (tmp_path / ".editorconfig").write_text("[*]\nmax_line_length = 120\n")
  repo = _repo(tmp_path / "repo", {"README": ""})
  assert file_style.configured_width(str(repo / "m.py")) is None
  assert file_style.detect("x = 1\n", str(repo / "m.py")).width == 80


def test_editorconfig_nearest_file_and_later_section_win(tmp_path):
  repo = _repo(tmp_path, {
      ".editorconfig": "root = true\n\n[*.py]\nmax_line_length = 100\n",
      "pkg/.editorconfig": "[*]\nmax_line_length = 120\n\n[*.py]\nmax_line_length = 80\n"
                           "\n[legacy/**.py]\nmax_line_length = off\n",
      "other/.editorconfig": "[*.py]\nmax_line_length = 90\n[*]\nmax_line_length = 110\n"})
  assert file_style.configured_width(str(repo / "m.py")) == 100
  assert file_style.configured_width(str(repo / "pkg" / "m.py")) == 80
  assert file_style.configured_width(str(repo / "pkg" / "legacy" / "old" / "m.py")) is None
  assert file_style.configured_width(str(repo / "other" / "m.py")) == 110


def test_editorconfig_root_stops_the_walk(tmp_path):
  repo = _repo(tmp_path, {".editorconfig": "[*.py]\nmax_line_length = 100\n",
                          "pkg/.editorconfig": "root = true\n[*.py]\nindent_size = 2\n"})
  assert file_style.configured_width(str(repo / "pkg" / "m.py")) is None
  assert file_style.configured_width(str(repo / "m.py")) == 100


PYTYPE = "  # pytype: disable=wrong-arg-types,attribute-error,wrong-keyword-args,module-attr"


def test_comments_docstrings_and_strings_do_not_raise_the_inferred_limit():
  code = [f"  value_{i} = compute(value_{i - 1}, scale=2.0)" for i in range(1, 40)]
  text = "\n".join([
      '"""A module docstring, on one line, that runs far past eighty columns, on purpose."""',
      "def f(value_0):",
      '  """Doc.',
      "",
      "  A docstring line that is much much longer than any line of code in this file is.",
      '  """',
      *code[:10],
      "  # " + "a comment-only line " * 6,
      *[line + PYTYPE for line in code[10:20]],
      '  message = """',
      "text inside a multi-line string, much much longer than any line of code in this file",
      '"""',
      '  f"""an f-string',
      "over lines, much much longer than any line of code in this file, by a wide margin",
      '"""',
      *code[20:],
      "  return value_39, message",
      ""])
  assert max(map(len, text.splitlines())) > 100
  assert max(file_style.code_lengths(text)) == len(code[-1])
  assert file_style.width_from_text(text) == 80


def test_code_lines_set_the_inferred_limit():
  wide = "".join(f"value_{i} = compute({'a' * 70!r}, scale=2.0)\n" for i in range(5))
  assert file_style.width_from_text(wide) == len(f"value_0 = compute({'a' * 70!r}, scale=2.0)")
  # Code a few columns short of a common limit was written to that limit.
  assert file_style.width_from_text("".join(f"v_{i} = {'a' * 78!r}\n" for i in range(5))) == 88
  # One long line is an outlier, not the limit.
  assert file_style.width_from_text("x = 1\n" * 20 + f"y = {'a' * 120!r}\n") == 80


def test_code_that_does_not_tokenize_is_measured_by_line():
  text = "x = (1,\n" + "y = 2" + PYTYPE * 2 + "\n# " + "c" * 150 + "\n"
  assert file_style.width_from_text(text) == 80


STEP_TEST = '''\
"""Tests for the training step; this module docstring runs well past eighty columns, on purpose."""
import functools
import unittest

import jax
import jax.numpy as jnp

TRAIN_STEP_AXES = (0, None)


class TrainStepTest(unittest.TestCase):PYTYPE

  def setUp(self):
    super().setUp()
    self.batch = jnp.ones((1, 4))PYTYPE
    self.parallel_train_step = jax.pmap(functools.partial(
        self._train_step,
        learning_rate=0.1), axis_name="batch", donate_argnums=(0,))

  def test_step(self):
    """Runs one step; this docstring line is long on purpose, far beyond the limit of the file."""
    with self.subTest("one"):
      step = jax.pmap(lambda p, b: jax.lax.pmean(p * b, "batch"),
                      axis_name="batch", in_axes=(0, 0))
      self.assertIsNotNone(step)
      nested = jax.pmap(jax.pmap(lambda p: jax.lax.psum(p, "model"), axis_name="model"),
                        axis_name="batch")
      self.assertIsNotNone(nested)

  @functools.partial(jax.pmap, axis_name="i", in_axes=TRAIN_STEP_AXES)
  def _train_step(self, params, learning_rate):
    return params * learning_rate
'''.replace("PYTYPE", PYTYPE)


def _left_of_their_statement(text: str) -> list[str]:
  """Continuation lines that start left of the first line of their statement."""
  lines = text.splitlines()
  inside_strings = set()
  found, start = [], None
  for tok in tokenize.generate_tokens(io.StringIO(text).readline):
    if tok.type == tokenize.STRING:
      inside_strings.update(range(tok.start[0] + 1, tok.end[0] + 1))
    if tok.type in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
      continue
    start = start or tok.start[0]
    if tok.type == tokenize.NEWLINE:
      first = lines[start - 1]
      for number in range(start + 1, tok.start[0] + 1):
        line = lines[number - 1]
        if (number not in inside_strings and line.strip()
            and len(line) - len(line.lstrip()) < len(first) - len(first.lstrip())):
          found.append(line)
      start = None
  return found


@pytest.mark.parametrize("config, width", [
    ({}, 80),  # its code reaches 78, its comments and docstrings 121
    ({"pyproject.toml": "[tool.pyink]\nline-length = 80\npyink-indentation = 2\n"}, 80),
    ({"setup.cfg": "[flake8]\nmax-line-length = 79\n"}, 79),
    ({".editorconfig": "[*.py]\nmax_line_length = 88\n"}, 88),
], ids=["inferred", "pyink", "flake8", "editorconfig"])
def test_no_added_line_beyond_the_limit_through_the_command_line(config, width, tmp_path):
  repo = _repo(tmp_path, config)
  target = repo / "step_test.py"
  target.write_text(STEP_TEST)
  subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", str(target), "--target", "jax",
                  "--in-place"], cwd=ROOT, check=True, capture_output=True)
  after = target.read_text()
  added = [line[1:] for line in difflib.unified_diff(STEP_TEST.splitlines(), after.splitlines(),
                                                     lineterm="", n=0)
           if line.startswith("+") and not line.startswith("+++")]
  # Plain sites, one given to pmap_via_shard_map (in_axes known only at run time) and
  # nested pmaps in the old form.
  assert "placed_on(" in after and "pmap_via_shard_map," in after, after
  assert "on_pmap_mesh(" in after, after
  assert "jax.pmap" not in after, after
  assert [line for line in added if len(line) > width] == [], after
  assert _left_of_their_statement(after) == [], after
  compile(after, str(target), "exec")


def test_copied_code_hanging_from_a_line_inside_a_method_hangs_from_its_new_line():
  # The function's lines hung from the old line's indentation; the copy starts a line of
  # its own, deeper, and they hang from that (they used to land at column 0).
  after, _ = rewrite('''\
      import functools
      import jax

      class StepTest:

        def setUp(self):
          self.parallel_train_step = jax.pmap(functools.partial(
              self._train_step,
              learning_rate=0.1), axis_name="batch", donate_argnums=(0,))
      ''', target="jax")
  lines = after.splitlines()
  at = next(i for i, line in enumerate(lines) if line.endswith("per_device(functools.partial("))
  column = lines[at].index("functools.partial(")
  assert lines[at + 1:at + 3] == [" " * (column + 4) + "self._train_step,",
                                  " " * (column + 4) + "learning_rate=0.1)),"], after
  assert _left_of_their_statement(after) == [], after


def test_copied_code_aligned_inside_itself_stays_aligned():
  after, _ = rewrite('''\
      import functools
      import jax

      class StepTest:

        def setUp(self):
          self.step = jax.pmap(functools.partial(self._train_step,
                                                 learning_rate=0.1), axis_name="batch")
      ''', target="jax")
  lines = after.splitlines()
  first = next(line for line in lines if "functools.partial(self._train_step," in line)
  second = lines[lines.index(first) + 1]
  assert second.index("learning_rate") == first.index("self._train_step"), after
  assert _left_of_their_statement(after) == [], after


def test_a_one_line_copy_that_does_not_fit_breaks_at_its_arguments():
  # acme's running_statistics_test: the function fit its old line, not its new place.
  before = '''\
      import functools
      import jax

      def test_pmap_update(state, x):
        pmap_axis_name = 'i'
        state = jax.pmap(
            functools.partial(update_and_validate, pmap_axis_name=pmap_axis_name),
            pmap_axis_name)(state, x)
        return state
      '''
  after, _ = rewrite(before, target="experimental")
  assert max(len(line) for line in after.splitlines()) <= 80, after
  assert ("functools.partial(update_and_validate,\n" in after
          and "pmap_axis_name=pmap_axis_name)" in after), after
  assert _left_of_their_statement(after) == [], after


def test_a_line_a_rename_takes_past_the_limit_is_broken_as_a_formatter_would():
  """pmap handed around as a value becomes pmap_via_shard_map, ten columns longer: a
  one-line statement that then passes the limit has its call's arguments one per line, or
  its value in parentheses on a hanging line; a line that fits stays as it was."""
  source = textwrap.dedent('''\
      import jax


      class T:

        def test(self, f, x):
          self.assertAllClose(f(jax.vmap, jax.pmap)(x, x), f(jax.pmap, jax.vmap)(x, x))
          mapper = jax.pmap if self.parallel_over_many_devices else jax.vmap  # choose
          short = jax.pmap if x else jax.vmap
          return mapper, short
      ''')
  new, _ = rewrite(source)
  assert textwrap.dedent('''\
        def test(self, f, x):
          self.assertAllClose(
              f(jax.vmap, pmap_via_shard_map)(x, x),
              f(pmap_via_shard_map, jax.vmap)(x, x))
          mapper = (
              pmap_via_shard_map if self.parallel_over_many_devices else jax.vmap
          )  # choose
          short = pmap_via_shard_map if x else jax.vmap
      ''') in textwrap.dedent(new[new.index("  def test"):]), new
  assert max(len(line) for line in new.splitlines()) <= 80


def test_a_mesh_statement_broken_in_a_function_aligns_with_its_parenthesis():
  new, _ = rewrite(textwrap.dedent('''\
      import jax


      def test(fv, x):
        return jax.pmap(fv, axis_name="batch_axis_name_that_is_long_enough_to_wrap")(x)
      '''))
  assert ("  mesh = jax.sharding.Mesh(pmap_devices(x),\n"
          "                           (\"batch_axis_name_that_is_long_enough_to_wrap\",))\n"
          ) in new, new


def test_arguments_after_a_converted_site_go_below_it_where_they_would_pass_the_limit():
  """``pmap(f)(long arguments)``: the arguments the site is called with stay on its last
  line where they fit, else they go on a line below, one continuation indent in."""
  new, _ = rewrite(textwrap.dedent('''\
      import jax


      def test(fv, x):
        if x is not None:
          res = jax.pmap(fv, axis_name="batch")(x.reshape((jax.device_count(), -1) + x.shape[1:]))
          return res, jax.pmap(fv, axis_name="batch")(x)
      '''))
  assert ("check_rep=False)))(\n"
          "        x.reshape((jax.device_count(), -1) + x.shape[1:]))\n") in new, new
  assert "check_rep=False)))(x)\n" in new, new
  assert max(len(line) for line in new.splitlines()) <= 80, new


def test_a_call_s_only_argument_opens_on_its_line_where_nothing_else_fits():
  """JAX's pmap_test.py: a copied lambda that fits no layout one level per call fits
  with ``jax.jit(shard_map(`` on one line, shard_map's arguments hanging from it."""
  source = textwrap.dedent('''\
      import jax
      from jax import lax, pmap


      class PmapTest:

        def testPermute(self):
          num_devices = jax.device_count()
          perm = [num_devices - 1] + list(range(num_devices - 1))
          f = pmap(lambda x: lax.ppermute(x, "i", zip(perm, range(num_devices))), "i")
          return f
      ''')
  new, _ = rewrite(source, target="experimental")
  assert "\n        jax.jit(shard_map(\n            per_device(\n" in new, new
  assert max(len(line) for line in new.splitlines()) <= 80, new
  # Where one level per call fits, calls open one per line, as before.
  shorter, _ = rewrite(source.replace("range(num_devices)", "range(n)"), target="experimental")
  assert "jax.jit(shard_map(" not in shorter, shorter
