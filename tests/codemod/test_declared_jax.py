"""Rule: a converted file is written for the shard_map form that runs on every jax its
repository declares (``codemod.targets``); where no form does, the report says so for the
file. The output of each choice runs on the declared releases and gives legacy's result."""
import json
import pathlib
import textwrap

import numpy as np
import pytest

from codemod import pmap_to_shmap, targets
from support.venvs import LEGACY, NEWEST, run_python

PROGRAM = textwrap.dedent('''\
    import json

    import jax
    import numpy as np

    step = jax.pmap(lambda x: x * 2 + jax.lax.psum(x, "i"), axis_name="i")

    if __name__ == "__main__":
      x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
      print(json.dumps(np.asarray(step(step(x))).tolist()))
    ''')


def _repo(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
  (root / ".git").mkdir(parents=True)
  for name, text in files.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(textwrap.dedent(text))
  return root


DECLARATIONS = [
    ("pyproject.toml", '[project]\nname = "a"\ndependencies = ["numpy", "jax>=0.6.1"]\n',
     "jax", True),
    ("pyproject.toml", '[project]\nname = "a"\ndependencies = ["jax[cuda12]>=0.4.31,<0.8"]\n',
     "experimental", True),
    ("pyproject.toml", '[tool.poetry.dependencies]\npython = "^3.10"\njax = "^0.4.35"\n',
     "experimental", True),
    ("setup.cfg", "[options]\ninstall_requires =\n    numpy\n    jax>=0.7,<0.8\n",
     "jax", True),
    ("setup.py", 'from setuptools import setup\nsetup(name="a", description="jax is fun",\n'
     '      install_requires=["jaxlib>=0.1", "jax==0.9.2"])\n', "jax", True),
    ("requirements.txt", "jaxtyping\njax >= 0.4.27  # kfac-jax's floor\n", None, False),
    ("requirements-dev.txt", "jax\n", None, False),
]


@pytest.mark.parametrize("name, text, target, serves", DECLARATIONS,
                         ids=[f"{d[0]}:{i}" for i, d in enumerate(DECLARATIONS)])
def test_the_form_is_chosen_from_the_declared_requirement(tmp_path, name, text, target, serves):
  repo = _repo(tmp_path, {name: text, "pkg/train.py": PROGRAM})
  choice = targets.for_file(str(repo / "pkg" / "train.py"))
  assert choice.declared is not None and choice.declared.source == str(repo / name)
  assert choice.serves is serves
  # Where no form serves, the installed jax decides, as without a declaration.
  assert choice.target == (target or targets.installed_target())
  assert (choice.note() is None) is serves


def test_the_nearest_declaration_wins_and_none_above_the_repository_counts(tmp_path):
  (tmp_path / "requirements.txt").write_text("jax>=0.4.31,<0.8\n")  # outside the repo
  repo = _repo(tmp_path / "repo", {"pyproject.toml": '[project]\nname = "r"\n',
                                   "sub/setup.cfg": "[options]\ninstall_requires = jax>=0.6.1\n",
                                   "sub/a.py": PROGRAM, "b.py": PROGRAM})
  assert targets.for_file(str(repo / "sub" / "a.py")).target == "jax"
  top = targets.for_file(str(repo / "b.py"))
  assert top.declared is None and top.target == targets.installed_target()


def test_an_explicit_target_that_misses_declared_releases_is_reported(tmp_path):
  repo = _repo(tmp_path, {"requirements.txt": "jax>=0.9\n"})
  choice = targets.for_file(str(repo / "x.py"), "experimental")
  assert choice.target == "experimental" and not choice.serves
  assert "requirements.txt admits ('jax>=0.9')" in (choice.note() or "")


def test_the_report_names_a_file_no_form_serves(tmp_path, capsys):
  repo = _repo(tmp_path, {"setup.py": 'setup(install_requires=["jax>=0.4.27"])\n',
                          "train.py": PROGRAM, "quiet.py": "import jax\n"})
  code = pmap_to_shmap.main([str(repo)])
  err = capsys.readouterr().err
  assert code == 0
  warned = [line for line in err.splitlines() if "does not run on every jax" in line]
  # Once, for the file with a converted site; a file left alone gets no such line.
  assert len(warned) == 1 and warned[0].startswith(f"{repo / 'train.py'}:1:1 WARNING"), err
  assert "setup.py admits ('jax>=0.4.27')" in warned[0]


@pytest.mark.parametrize("requirement, release", [("jax>=0.6.1", NEWEST),
                                                  ("jax>=0.4.31,<0.8", LEGACY)])
def test_the_chosen_form_runs_on_a_declared_release_with_legacys_result(
    tmp_path, requirement, release):
  repo = _repo(tmp_path, {"requirements.txt": requirement + "\n", "train.py": PROGRAM})
  legacy = run_python(LEGACY, [str(repo / "train.py")], cwd=str(repo))
  assert legacy.returncode == 0, legacy.stderr
  assert pmap_to_shmap.main(["--in-place", str(repo)]) == 0
  converted = (repo / "train.py").read_text()
  assert "jax.pmap" not in converted
  expected_form = "jax.shard_map" if release == NEWEST else "jax.experimental.shard_map"
  assert expected_form in converted, converted
  ours = run_python(release, [str(repo / "train.py")], cwd=str(repo))
  assert ours.returncode == 0, ours.stderr
  np.testing.assert_array_equal(np.array(json.loads(ours.stdout)),
                                np.array(json.loads(legacy.stdout)))
