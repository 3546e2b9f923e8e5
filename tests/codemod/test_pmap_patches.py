"""Code that replaces jax.pmap while it runs (chex's ``fake_pmap``, ``mock.patch``) keeps
its pmap sites: under the patch, ``jax.pmap`` there is the replacement, not JAX's pmap."""
import re
import textwrap

import pytest

from codemod import pmap_patches, pmap_to_shmap
from codemod_testing import rewrite

FAKES = '''\
import contextlib
from unittest import mock

import jax


def _vmap_pmap(fun, axis_name=None, **unused):
  return jax.vmap(fun, axis_name=axis_name)


@contextlib.contextmanager
def my_fake_pmap():
  with mock.patch.object(jax, "pmap", _vmap_pmap):
    yield


def fake_everything():
  stack = contextlib.ExitStack()
  stack.enter_context(my_fake_pmap())
  return stack


def unrelated():
  return jax.jit(lambda x: x)
'''

USES_FAKE = '''\
import jax
import numpy as np

import fakes


def helper(x):
  return jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")(x)


def test_sum():
  with fakes.fake_everything():
    assert helper(np.ones((3, 2))).shape == (3, 2)
'''


def test_patchers_are_the_functions_that_patch_pmap_directly_or_through_another():
  assert pmap_patches.patchers([FAKES]) == pmap_patches.KNOWN_PATCHERS | {
      "my_fake_pmap", "fake_everything"}


@pytest.mark.parametrize("patch", [
    'mock.patch("jax.pmap", fake)',
    'mock.patch.object(jax, "pmap", fake)',
    'monkeypatch.setattr(jax, "pmap", fake)',
    'monkeypatch.setattr("jax.pmap", fake)',
    'setattr(jax, "pmap", fake)',
    'jax.pmap = fake',
])
def test_each_way_of_patching_pmap_is_found(patch):
  text = f"import jax\n\n\ndef fake_it(fake, monkeypatch, mock):\n  {patch}\n"
  assert "fake_it" in pmap_patches.patchers([text])
  assert pmap_patches.patched(text).first.line == 5


def test_an_attribute_named_pmap_of_something_else_is_no_patch():
  text = "import jax\n\n\nclass T:\n  def setup(self):\n    self.pmap = jax.pmap(abs)\n"
  assert pmap_patches.patched(text) is None
  assert pmap_patches.patchers([text]) == pmap_patches.KNOWN_PATCHERS


def test_a_file_that_calls_chex_fake_pmap_keeps_its_sites():
  source = textwrap.dedent('''\
      import chex
      import jax


      def test_fake():
        with chex.fake_pmap():
          return jax.pmap(lambda x: x + 1)(jax.numpy.ones((3, 2)))
      ''')
  new, findings = rewrite(source, target="experimental")
  assert new == source
  assert [(f.line, f.severity.value) for f in findings] == [(6, "WARNING"), (7, "ERROR")]
  assert "fake_pmap(...) replaces jax.pmap" in findings[0].message
  assert "it may run where the file replaces jax.pmap (line 6)" in findings[1].message


def test_functools_wraps_of_pmap_is_not_a_site():
  # chex's fake.py: the fake takes pmap's name and docstring, and jax.pmap keeps them.
  source = textwrap.dedent('''\
      import functools

      import jax


      @functools.wraps(jax.pmap)
      def fake(fun, axis_name=None):
        return jax.vmap(fun, axis_name=axis_name)


      g = functools.update_wrapper(lambda f: f, jax.pmap)
      ''')
  new, findings = rewrite(source, target="experimental")
  assert new == source and findings == []


def test_a_run_finds_the_repository_s_own_patchers(tmp_path, capsys):
  (tmp_path / ".git").mkdir()
  (tmp_path / "fakes.py").write_text(FAKES)
  (tmp_path / "test_sum.py").write_text(USES_FAKE)
  (tmp_path / "plain.py").write_text(
      'import jax\n\ng = jax.pmap(lambda v: v, axis_name="i")\n')
  report = tmp_path / "report.txt"
  assert pmap_to_shmap.main([str(tmp_path), "--in-place", "--report", str(report)]) == 0
  assert (tmp_path / "test_sum.py").read_text() == USES_FAKE
  assert (tmp_path / "fakes.py").read_text() == FAKES
  assert "jax.pmap(" not in (tmp_path / "plain.py").read_text()
  lines = report.read_text().splitlines()
  assert any("test_sum.py:12:8 WARNING fake_everything(...) replaces jax.pmap" in line
             for line in lines), lines
  assert any("test_sum.py:8:10 ERROR pmap left unchanged: it may run where the file replaces "
             "jax.pmap (line 12)" in line
             for line in lines), lines
  assert lines[-1].startswith("3 files scanned, 1 changed; 2 pmap sites found, 1 converted, "
                              "1 reported")


@pytest.mark.parametrize("replacement, module", [
    ("batching.pmap = stub", "pkg.batching"),
    ("b.pmap = stub", "pkg.batching"),
    ("pkg.batching.pmap = stub", "pkg.batching"),
    ('mock.patch("pkg.batching.pmap", stub)', "pkg.batching"),
    ('mock.patch.object(batching, "pmap", stub)', "pkg.batching"),
    ('monkeypatch.setattr(batching, "pmap", stub)', "pkg.batching"),
    ('setattr(batching, "pmap", stub)', "pkg.batching"),
    ("module.pmap = stub", None),  # a module passed in: which one, the code does not say
])
def test_each_way_of_replacing_a_module_s_pmap_is_found(replacement, module):
  text = ("import pkg.batching\nimport pkg.batching as b\nfrom pkg import batching\n\n\n"
          f"def stub_out(module, stub, monkeypatch, mock):\n  {replacement}\n")
  [found] = pmap_patches.module_replacements([("test_utils.py", text)])
  assert (found.path, found.line, found.module) == ("test_utils.py", 7, module)


@pytest.mark.parametrize("replacement", [
    "self.pmap = stub", "jax.pmap = stub", 'mock.patch("jax.pmap", stub)',
    'setattr(jax, "pmap", stub)', "pmap = stub",
    "config.pmap = True", 'setattr(config, "pmap", False)'])  # settings, not functions
def test_replacing_jax_s_own_pmap_or_an_attribute_is_no_module_replacement(replacement):
  text = f"import jax\n\n\ndef stub_out(self, stub, mock, config):\n  {replacement}\n"
  assert pmap_patches.module_replacements([("t.py", text)]) == ()


BATCHING = '''\
from jax import pmap


def mapped(f, x):
  return pmap(f)(x)
'''

STUB_OUT = '''\
import jax


def stub_out_pmap(batch):
  batch.pmap = jax.vmap
'''


def test_a_module_whose_pmap_a_run_replaces_keeps_its_sites(tmp_path):
  # neural-tangents' tests replace `batching.pmap` (bound by `from jax import pmap`) with a
  # vmap through a helper given the module: converted, batching would no longer call it.
  (tmp_path / ".git").mkdir()
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "__init__.py").write_text("")
  (tmp_path / "pkg" / "batching.py").write_text(BATCHING)
  (tmp_path / "pkg" / "plain.py").write_text(
      "import jax\n\n\ndef mapped(f, x):\n  return jax.pmap(f)(x)\n")
  (tmp_path / "tests").mkdir()
  (tmp_path / "tests" / "test_utils.py").write_text(STUB_OUT)
  report = tmp_path / "report.txt"
  assert pmap_to_shmap.main([str(tmp_path), "--in-place", "--report", str(report)]) == 0
  assert (tmp_path / "pkg" / "batching.py").read_text() == BATCHING
  assert "jax.pmap(" not in (tmp_path / "pkg" / "plain.py").read_text()
  lines = report.read_text().splitlines()
  replacement = f"{tmp_path / 'tests' / 'test_utils.py'}:5"
  assert any(line.startswith(f"{tmp_path / 'pkg' / 'batching.py'}:1:1 WARNING batch.pmap = "
                             f"... ({replacement}) replaces the pmap of a module it is given")
             for line in lines), lines
  assert any(f"batching.py:5:10 ERROR pmap left unchanged: {replacement} may replace this "
             "module's pmap" in line for line in lines), lines


def test_a_replacement_naming_another_module_leaves_this_one_converted(tmp_path):
  (tmp_path / ".git").mkdir()
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "__init__.py").write_text("")
  (tmp_path / "pkg" / "batching.py").write_text(BATCHING)
  (tmp_path / "pkg" / "other.py").write_text(BATCHING)
  (tmp_path / "test_other.py").write_text(
      "from unittest import mock\n\n\ndef test():\n"
      '  with mock.patch("pkg.other.pmap", lambda f: f):\n    pass\n')
  assert pmap_to_shmap.main([str(tmp_path), "--in-place"]) == 0
  assert (tmp_path / "pkg" / "other.py").read_text() == BATCHING
  assert "pmap(f)" not in (tmp_path / "pkg" / "batching.py").read_text()


SCOPED = '''\
import unittest

import chex
import jax
import numpy as np


def summed(x):
  return jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")(x)


def doubled(x):
  return jax.pmap(lambda v: 2 * v)(x)


def summed_twice(x):
  return summed(summed(x))


class FakeTest(unittest.TestCase):

  def setUp(self):
    super().setUp()
    self.enter_context(chex.fake_pmap())

  def test_method_site(self):
    jax.pmap(lambda v: v)(np.ones((1, 2)))


def test_fake():
  with chex.fake_pmap():
    summed_twice(np.ones((3, 2)))


def test_real():
  doubled(np.ones((1, 2)))
  jax.pmap(abs)(np.ones((1, 2)))
'''


def test_only_the_code_that_runs_under_a_patch_keeps_its_sites():
  # jaxline's utils_test.py fakes pmap in one test: its other tests' sites are converted.
  new, findings = rewrite(SCOPED, target="experimental")
  left = sorted((f.line, re.search(r"replaces jax.pmap \(line (\d+)\)", f.message)[1])
                for f in findings if f.severity.value == "ERROR")
  # summed, named by what the faking test names; the class that fakes in setUp; each with
  # the line of its patch. Not doubled, not test_real.
  assert left == [(9, "31"), (27, "24")], findings
  assert "jax.pmap(lambda v: 2 * v)" not in new and "jax.pmap(abs)" not in new
  assert new.count("jax.pmap(") == 2
  [warning] = [f for f in findings if "replaces jax.pmap while" in f.message]
  assert (warning.line, warning.severity.value) == (24, "WARNING")
  assert "the pmap sites of this file that may run under it" in warning.message


@pytest.mark.parametrize("patch", [
    "chex.fake_pmap().start()",
    "@pytest.fixture(autouse=True)\ndef fake():\n  with chex.fake_pmap():\n    yield",
    "def setUpModule():\n  chex.fake_pmap().start()",
])
def test_a_module_wide_patch_keeps_every_site(patch):
  source = (f"import chex\nimport jax\nimport pytest\n\n{patch}\n\n\n"
            "def test_a(x):\n  return jax.pmap(abs)(x)\n")
  new, findings = rewrite(source, target="experimental")
  assert new == source
  assert [f.severity.value for f in findings] == ["WARNING", "ERROR"]
