"""A converted site in a library's public API is reported loudly, at the site: the
rewrite changes what every caller of the library gets. Private code, code that hands
nothing back, scripts and tests are not."""
from __future__ import annotations

import json
import pathlib

from codemod.findings import Severity
from codemod.runner import Options, transform_file

MODULE = '''\
import jax


def make_step(f):
  return jax.pmap(f, axis_name="i")


def _make_private(f):
  return jax.pmap(f, axis_name="i")


def barrier(x):
  jax.device_get(jax.pmap(lambda v: jax.lax.psum(v, "i"), "i")(x))


class Trainer:

  def step(self, x):
    return jax.pmap(lambda v: v * 2, axis_name="i")(x)

  def _inner(self, x):
    return jax.pmap(lambda v: v * 3, axis_name="i")(x)

  def __call__(self, x):
    def run(v):
      return jax.pmap(lambda w: w + 1, axis_name="i")(v)
    return run(x)


class _Hidden:

  def step(self, x):
    return jax.pmap(lambda v: v - 1, axis_name="i")(x)


double = jax.pmap(lambda v: v * 2, axis_name="i")
_half = jax.pmap(lambda v: v / 2, axis_name="i")
'''

# The public names the report gives for MODULE inside a package, in the file's order.
PUBLIC = ["make_step", "Trainer.step", "Trainer.__call__", "double"]


def _tree(tmp_path: pathlib.Path, relative: str) -> str:
  path = tmp_path / relative
  path.parent.mkdir(parents=True, exist_ok=True)
  for parent in path.relative_to(tmp_path).parents:
    if str(parent) != ".":
      (tmp_path / parent / "__init__.py").touch()
  path.write_text(MODULE)
  return str(path)


def _public(path: str) -> list[str]:
  """The public names the report gives, each at a site's line."""
  result = transform_file(path, Options(target="experimental"))
  assert result.sites_converted == 9, result.findings
  said = [f for f in result.findings if "public API" in f.message]
  lines = MODULE.splitlines()
  assert all(f.severity is Severity.WARNING and "jax.pmap(" in lines[f.line - 1]
             for f in said), said
  return [f.message.split(" is public API")[0] for f in said]


def test_sites_in_public_definitions_of_a_library_module_are_reported(tmp_path):
  path = _tree(tmp_path, "lib/train/steps.py")
  assert _public(path) == [f"lib.train.steps.{name}" for name in PUBLIC]


def test_a_package_s_init_module_is_named_by_its_package(tmp_path):
  path = _tree(tmp_path, "lib/train/__init__.py")
  assert _public(path) == [f"lib.train.{name}" for name in PUBLIC]


def test_private_modules_tests_and_scripts_are_not_public_api(tmp_path):
  for relative in ("lib/_impl/steps.py", "lib/_steps.py", "lib/tests/steps.py",
                   "lib/steps_test.py", "lib/test_steps.py"):
    assert _public(_tree(tmp_path, relative)) == [], relative
  script = tmp_path / "scripts" / "steps.py"
  script.parent.mkdir()
  script.write_text(MODULE)
  assert _public(str(script)) == []


def test_a_notebook_inside_a_package_is_not_public_api(tmp_path):
  path = pathlib.Path(_tree(tmp_path, "lib/steps.py")).with_suffix(".ipynb")
  cell = {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
          "source": MODULE.splitlines(keepends=True)}
  path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4,
                              "nbformat_minor": 5}))
  assert _public(str(path)) == []
