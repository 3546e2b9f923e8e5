"""A converted file passes the repository's formatter check where the original did.

Where the repository configures ruff, black or pyink (or runs ruff or black as a
pre-commit hook) and the original file is exactly what that formatter writes, the
converted file and the support module written next to it go through it too: checked here
with ``ruff format --check`` (black's style) or ``pyink --check`` run with the repository's
own settings. Elsewhere the codemod's own layout is kept, byte for byte what a run without
any configuration writes."""
from __future__ import annotations

import os
import pathlib
import stat
import subprocess
import sys

import pytest

from codemod import pmap_to_shmap, repo_formatter, support_module

RUFF = pathlib.Path(sys.executable).parent / "ruff"
# Formatted as ruff and black write it at their default width.
SITE = '''\
import jax
import jax.numpy as jnp


def step(params, batch):
    grads = jax.grad(lambda p: jnp.sum((batch @ p) ** 2))(params)  # a comment
    return params - 0.1 * jax.lax.pmean(grads, "batch")


def train(params, batches):
    p_step = jax.pmap(step, axis_name="batch", donate_argnums=(0,))
    for batch in batches:
        params = p_step(params, batch)
    return params
'''
# The same program in single quotes, as black writes it with skip-string-normalization.
SINGLE_QUOTED = SITE.replace('"batch"', "'batch'")
# The same program in 2-column blocks, as pyink writes it with pyink-indentation = 2.
TWO_COLUMNS = SITE.replace("    ", "  ")
PYINK_GOOGLE = ("[tool.pyink]\nline-length = 80\nunstable = true\npyink-indentation = 2\n"
                "pyink-use-majority-quotes = true\n")


def _repository(tmp_path: pathlib.Path, files: dict[str, str], site: str = SITE) -> pathlib.Path:
  root = tmp_path / "repo"
  (root / ".git").mkdir(parents=True)
  (root / "pkg").mkdir()
  (root / "pkg" / "__init__.py").write_text("")
  (root / "pkg" / "train.py").write_text(site)
  for name, text in files.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)
  return root


def _convert(root: pathlib.Path) -> str:
  run = subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", str(root / "pkg"),
                        "--in-place"], capture_output=True, text=True, timeout=300,
                       check=False, cwd=pathlib.Path(__file__).resolve().parents[2])
  assert run.returncode == 0, run.stdout + run.stderr
  assert "1 converted" in run.stderr, run.stderr
  return (root / "pkg" / "train.py").read_text()


def _format_check(root: pathlib.Path, *options: str) -> subprocess.CompletedProcess:
  """The repository's check: ``ruff format --check`` with ``options``, or, where they
  start with "pyink", ``pyink --check`` with the repository's pyproject.toml."""
  command = ([sys.executable, "-m", "pyink", "--check", "--config", "pyproject.toml"]
             if options[:1] == ("pyink",) else
             [str(RUFF), "format", "--check", "--no-cache", *options])
  return subprocess.run([*command, "pkg"], capture_output=True, text=True, timeout=120,
                        check=False, cwd=root)


BLACK_OPTIONS = ("--isolated", "--line-length", "100", "--config", "format.quote-style='preserve'")
CONFIGURED = {
    "ruff": ({"pyproject.toml": "[tool.ruff]\nline-length = 88\n"}, SITE, ()),
    "ruff.toml": ({"ruff.toml": "line-length = 88\n"}, SITE, ()),
    "black": ({"pyproject.toml": "[tool.black]\nline-length = 100\n"
                                 "skip-string-normalization = true\n"},
              SINGLE_QUOTED, BLACK_OPTIONS),
    # ruff's formatter configured beside pyink's settings
    "ruff format beside pyink": ({"pyproject.toml": "[tool.pyink]\nline-length = 80\n"
                                                    "[tool.ruff.format]\nquote-style = 'double'\n"},
                                 SITE, ()),
    "pre-commit ruff-format": ({".pre-commit-config.yaml": (
        "repos:\n- repo: https://github.com/astral-sh/ruff-pre-commit\n  rev: v0.6.0\n"
        "  hooks:\n  - id: ruff\n  - id: ruff-format\n")}, SITE, ()),
    "pre-commit black": ({".pre-commit-config.yaml": (
        "repos:\n  - repo: https://github.com/psf/black\n    rev: 24.4.2\n    hooks:\n"
        "      - id: black\n")}, SITE, ("--isolated",)),
    # Google's pyink settings (brax, chex, flax, optax, rlax)
    "pyink": ({"pyproject.toml": PYINK_GOOGLE}, TWO_COLUMNS, ("pyink",)),
    # the same in a package with a module named as a standard library one (brax's math.py)
    "pyink, package with math.py": ({"pyproject.toml": PYINK_GOOGLE, "pkg/math.py": ""},
                                    TWO_COLUMNS, ("pyink",)),
    # ruff's lint settings beside pyink's: pyink formats
    "ruff lint beside pyink": ({"pyproject.toml": "[tool.pyink]\nline-length = 88\n"
                                                  "[tool.ruff.lint]\nselect = ['F']\n"},
                               SITE, ("pyink",)),
}


@pytest.mark.parametrize("name", CONFIGURED)
def test_formatted_original_stays_formatted(tmp_path, name):
  files, site, options = CONFIGURED[name]
  root = _repository(tmp_path, files, site)
  assert _format_check(root, *options).returncode == 0  # the premise: formatted before
  converted = _convert(root)
  check = _format_check(root, *options)
  assert check.returncode == 0, check.stdout + converted
  assert (root / "pkg" / support_module.PACKAGE_NAME).with_suffix(".py").exists()
  # Only the site's lines moved: every other line of the original is still there, in order.
  kept = iter(converted.splitlines())
  assert all(line in kept for line in site.splitlines() if "pmap" not in line), converted
  # The same program the codemod's own layout writes, comments included.
  plain = _convert(_repository(tmp_path / "plain", {}, site))
  assert support_module.tree_digest(converted) == support_module.tree_digest(plain)
  assert "# a comment" in converted
  assert "jax.pmap" not in converted


def test_rerun_over_formatted_output_changes_nothing(tmp_path):
  root = _repository(tmp_path, CONFIGURED["ruff"][0])
  _convert(root)
  run = subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", str(root / "pkg"),
                        "--check"], capture_output=True, text=True, timeout=300, check=False,
                       cwd=pathlib.Path(__file__).resolve().parents[2])
  assert run.returncode == 0, run.stdout + run.stderr
  path = root / "pkg" / f"{support_module.PACKAGE_NAME}.py"
  assert support_module.status_of(path.read_text(), ["per_device", "placed_on"]) \
      is support_module.Status.CURRENT


NOT_FORMATTED = {
    # configured, but this file is not what ruff writes (2-space blocks)
    "unformatted original": ({"pyproject.toml": "[tool.ruff]\nline-length = 88\n"},
                             SITE.replace("    ", "  ")),
    # yapf is not run
    "yapf": ({"pyproject.toml": "[tool.yapf]\nbased_on_style = 'pep8'\n"}, SITE),
    # pyink configured, but this file is not what pyink writes (4-column blocks)
    "unformatted for pyink": ({"pyproject.toml": PYINK_GOOGLE}, SITE),
    # a configuration ruff refuses
    "broken ruff configuration": ({"ruff.toml": "line-length = 'wide'\n"}, SITE),
}


@pytest.mark.parametrize("name", NOT_FORMATTED)
def test_codemod_layout_kept(tmp_path, name):
  files, site = NOT_FORMATTED[name]
  root, plain_root = _repository(tmp_path, files, site), _repository(tmp_path / "plain", {}, site)
  assert _convert(root) == _convert(plain_root)
  # The support module too: a repository whose files ruff does not format (its settings
  # there for the linter) does not get one ruff formatted.
  support = pathlib.Path("pkg", f"{support_module.PACKAGE_NAME}.py")
  assert (root / support).read_text() == (plain_root / support).read_text()


def test_a_formatter_the_codemod_does_not_run_is_named_in_the_report(tmp_path):
  root = _repository(tmp_path, NOT_FORMATTED["yapf"][0])
  run = subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", str(root / "pkg")],
                       capture_output=True, text=True, timeout=300, check=False,
                       cwd=pathlib.Path(__file__).resolve().parents[2])
  said = [line for line in run.stderr.splitlines() if "formats with yapf" in line]
  assert len(said) == 1 and said[0].startswith(str(root / "pyproject.toml") + ":1:1 INFO"), \
      run.stderr
  assert "1 converted file below it keeps the codemod's layout; run yapf" in said[0]
  # ruff's, black's and pyink's repositories, and those with none, get no such line.
  for files in ({"pyproject.toml": "[tool.ruff]\n"}, {"pyproject.toml": PYINK_GOOGLE}, {}):
    other = _repository(tmp_path / str(len(str(files))), files)
    run = subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", str(other / "pkg")],
                         capture_output=True, text=True, timeout=300, check=False,
                         cwd=pathlib.Path(__file__).resolve().parents[2])
    assert "formats with" not in run.stderr, run.stderr


def test_pyink_not_installed_is_named_in_the_report(tmp_path, monkeypatch, capsys):
  root = _repository(tmp_path, {"pyproject.toml": PYINK_GOOGLE}, TWO_COLUMNS)
  monkeypatch.setattr(repo_formatter, "_pyink", lambda: None)
  assert pmap_to_shmap.main([str(root / "pkg"), "--in-place"]) == 0
  said = [line for line in capsys.readouterr().err.splitlines() if "formats with" in line]
  assert said == [f"{root / 'pyproject.toml'}:1:1 INFO the repository formats with pyink "
                  "([tool.pyink]), which the codemod does not run (not installed here): 1 "
                  "converted file below it keeps the codemod's layout; run pyink on it "
                  "before review"]
  assert (root / "pkg" / "train.py").read_text() == _convert(
      _repository(tmp_path / "plain", {}, TWO_COLUMNS))


def test_without_configuration_the_codemod_layout(tmp_path):
  root = _repository(tmp_path, {})
  converted = _convert(root)
  assert _format_check(root).returncode != 0, converted  # the codemod's own hanging layout
  assert repo_formatter.configured(str(root / "pkg" / "train.py")) is None


def _fake_formatter(tmp_path: pathlib.Path, program: str) -> repo_formatter.Formatter:
  """A formatter executable that runs ``program`` (Python) on the text it is given."""
  script = tmp_path / "fake-ruff"
  script.write_text(f"#!{sys.executable}\nimport sys\ntext = sys.stdin.read()\n{program}\n"
                    "sys.stdout.write(text)\n")
  script.chmod(script.stat().st_mode | stat.S_IXUSR)
  return repo_formatter.Formatter((os.fspath(script),), "ruff")


@pytest.mark.parametrize("program", [
    "text = text.replace('  # a comment', '')",     # drops a comment
    "text = text.replace('0.1', '0.2')",            # changes the program
    "sys.exit(2)",                                   # fails
])
def test_a_formatter_that_changes_the_file_is_not_used(tmp_path, program):
  formatter = _fake_formatter(tmp_path, program)
  assert repo_formatter.reformatted(formatter, SITE, str(tmp_path / "train.py")) is None


def test_a_formatter_that_only_lays_out_is_used(tmp_path):
  formatter = _fake_formatter(tmp_path, "text = text.replace('(params)  #', '(\\n    params\\n)  #')")
  out = repo_formatter.reformatted(formatter, SITE, str(tmp_path / "train.py"))
  assert out is not None and out != SITE
  assert support_module.tree_digest(out) == support_module.tree_digest(SITE)
