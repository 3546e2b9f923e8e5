"""The support module a repository keeps: within 80 columns, and still recognised as
pmap-to-shmap's after the repository's formatter rewrote it (a rerun leaves a current
copy as the formatter made it, replaces an older one, and refuses an edited one)."""
import hashlib
import itertools
import pathlib
import subprocess
import sys

import pytest

from codemod import support_module

ROOT = pathlib.Path(__file__).resolve().parents[2]
SITE = 'import jax\n\n\ndef f(x):\n    return x\n\n\ng = jax.pmap(f, axis_name="i")\n'
NAME = "pmap_shard_map.py"
# What the converted SITE calls: the copy written next to it holds just those helpers,
# in a repository that declares a jax whose shard_map keeps output trees (DECLARED), with
# the code for keyword calls of a public name.
SITE_NAMES = {"per_device", "placed_on", "KEYWORD_CALLS"}
DECLARED = '[project]\nname = "tree"\ndependencies = ["jax>=0.7.2"]\n'


# ruff format settings a repository may use (black's and pyink's styles are ruff
# format's with these knobs): line length, indent width, quotes, docstring code.
STYLES = {
    "4 spaces, 88": ["--line-length", "88"],
    "4 spaces, 80, single quotes": ["--line-length", "80", "--config",
                                    "format.quote-style='single'"],
    "2 spaces, 80": ["--line-length", "80", "--config", "indent-width=2"],
    "2 spaces, 100": ["--line-length", "100", "--config", "indent-width=2"],
    "4 spaces, 120, no magic trailing comma": [
        "--line-length", "120", "--config", "format.skip-magic-trailing-comma=true"],
    "4 spaces, 60, docstring code": ["--line-length", "60", "--config",
                                     "format.docstring-code-format=true"],
    "2 spaces, 72, single quotes": [
        "--line-length", "72", "--config", "indent-width=2", "--config",
        "format.quote-style='single'"],
}


def _ruff(*args: str, cwd: pathlib.Path) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=cwd, capture_output=True,
                        text=True, timeout=120, check=False)


def _formatted(text: str, style: list[str], tmp_path: pathlib.Path) -> str:
  path = tmp_path / "formatted" / NAME
  path.parent.mkdir(exist_ok=True)
  path.write_text(text)
  proc = _ruff("format", "--no-cache", "--isolated", *style, str(path), cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr
  formatted = path.read_text()
  assert formatted != text  # the style did rewrite it
  return formatted


def _codemod(tree: pathlib.Path) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", str(tree), "--in-place"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)


def _converted_tree(tmp_path: pathlib.Path) -> pathlib.Path:
  """A tree whose script pkg/site.py was converted; its support copy is pkg/NAME."""
  tree = tmp_path / "tree"
  (tree / "pkg").mkdir(parents=True)
  (tree / "pyproject.toml").write_text(DECLARED)
  (tree / "pkg" / "site.py").write_text(SITE)
  proc = _codemod(tree)
  assert proc.returncode == 0, proc.stderr
  assert (tree / "pkg" / NAME).read_text() == support_module.source(SITE_NAMES)
  return tree


# ----- within 80 columns -----

def test_every_line_of_the_written_module_fits_80_columns(tmp_path):
  lines = support_module.source().splitlines()
  assert [(n, len(l)) for n, l in enumerate(lines, 1) if len(l) > 80] == []
  (tmp_path / NAME).write_text(support_module.source())
  proc = _ruff("check", "--no-cache", "--isolated", "--select", "E501", "--line-length", "80",
               NAME, cwd=tmp_path)
  assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("names", [None, SITE_NAMES, {"first_rows"}, {"pmap_via_shard_map"}],
                         ids=["all", "plain sites", "first_rows", "pmap_via_shard_map"])
def test_the_written_module_has_its_imports_sorted(tmp_path, names):
  # isort's and ruff's default layout, blank lines after the imports included.
  (tmp_path / NAME).write_text(support_module.source(names))
  proc = _ruff("check", "--no-cache", "--isolated", "--select", "I001", NAME, cwd=tmp_path)
  assert proc.returncode == 0, proc.stdout + proc.stderr


# The helpers plain sites call, with each combination of the flags a site may need.
PLAIN_HELPERS = {"per_device", "placed_on", "pmap_devices", "on_first_call", "first_row",
                 "first_rows", "device_put_replicated", "device_put_sharded"}
PLAIN_FLAGS = sorted(support_module.FEATURES - {support_module.RUN_TIME_OPTIONS})


@pytest.mark.parametrize("flags", [frozenset(c) for n in range(len(PLAIN_FLAGS) + 1)
                                   for c in itertools.combinations(PLAIN_FLAGS, n)],
                         ids=lambda flags: "+".join(sorted(flags)) or "no flags")
@pytest.mark.parametrize("style", ["4 spaces, 88", "2 spaces, 80"])
def test_black_and_pyink_keep_the_plain_helpers_as_written(tmp_path, style, flags):
  """Each statement is one line a formatter leaves whole (black's style at its default
  length, pyink's at 80), so a formatted copy differs from the codemod's only in blank
  lines (after the module's docstring, and after each nested def that a statement
  follows). A statement written over two lines would come back as three to eight."""
  ours = support_module.source(PLAIN_HELPERS | flags)
  formatted = _formatted(ours, STYLES[style], tmp_path)
  assert (["".join(line.split()) for line in formatted.splitlines() if line.strip()]
          == ["".join(line.split()) for line in ours.splitlines() if line.strip()])


# ----- a formatter's rewrite is still ours -----

@pytest.mark.parametrize("style", list(STYLES.values()), ids=list(STYLES))
def test_reformatted_copy_is_current(tmp_path, style):
  formatted = _formatted(support_module.source(), style, tmp_path)
  assert formatted.splitlines()[0] == support_module.source().splitlines()[0]
  assert support_module.status_of(formatted) is support_module.Status.CURRENT
  assert support_module.is_support_module(formatted)


@pytest.mark.parametrize("style", ["4 spaces, 88", "2 spaces, 80",
                                   "4 spaces, 80, single quotes"])
def test_rerun_leaves_a_reformatted_copy_byte_for_byte(tmp_path, style):
  tree = _converted_tree(tmp_path)
  formatted = _formatted(support_module.source(SITE_NAMES), STYLES[style], tmp_path)
  (tree / "pkg" / NAME).write_text(formatted)
  site = (tree / "pkg" / "site.py").read_bytes()
  proc = _codemod(tree)
  assert proc.returncode == 0, proc.stderr
  assert (tree / "pkg" / NAME).read_text() == formatted
  assert (tree / "pkg" / "site.py").read_bytes() == site


def test_rerun_refuses_a_reformatted_copy_with_one_statement_changed(tmp_path):
  tree = _converted_tree(tmp_path)
  formatted = _formatted(support_module.source(SITE_NAMES), STYLES["2 spaces, 80"], tmp_path)
  edited = formatted.replace("else jax.device_put(x, to)",
                             "else jax.device_put(x, to, may_alias=True)")
  assert edited != formatted
  (tree / "pkg" / NAME).write_text(edited)
  proc = _codemod(tree)
  assert proc.returncode == 2 and "--support-module" in proc.stderr, proc.stderr
  assert (tree / "pkg" / NAME).read_text() == edited


def test_docstring_and_comment_edits_are_formatting_code_edits_are_not():
  text = support_module.source()
  reworded = text.replace("Row 0 of each block", "The first row of each block").replace(
      "# pmap's axis_name=None: the axis", "# pmap's axis_name=None: this axis")
  assert reworded != text
  assert support_module.status_of(reworded) is support_module.Status.CURRENT
  for old, new in [('"_pmap_unnamed_axis"', '"_pmap_unnamed"'), ("maxsize=64", "maxsize=65"),
                   ("import math\n", "import math\nimport os\n")]:
    assert old in text
    assert support_module.status_of(text.replace(old, new)) is support_module.Status.FOREIGN


# ----- older copies, formatted or not, are replaced -----

def _older_body() -> str:
  """A body of an earlier version: the current one with one constant changed."""
  body = support_module.body()
  assert "maxsize=64" in body
  return body.replace("maxsize=64", "maxsize=32")


@pytest.mark.parametrize("formatted", [False, True])
@pytest.mark.parametrize("header", [
    "# pmap-to-shmap support module v3 sha256:{digest}. Do not edit.",
    '"""pmap-to-shmap support v8 sha256:{digest}. Do not edit."""',
])
def test_older_copy_is_stale_and_replaced(tmp_path, formatted, header):
  body = _older_body()
  digest = support_module.tree_digest(body)
  assert digest is not None
  text = header.format(digest=digest) + "\n" + body
  if formatted:
    text = _formatted(text, STYLES["4 spaces, 88"], tmp_path)
  assert support_module.status_of(text) is support_module.Status.STALE
  (tmp_path / NAME).write_text(text)
  assert support_module.write(str(tmp_path), "pmap_shard_map")
  assert (tmp_path / NAME).read_text() == support_module.source()


def test_v2_copy_reformatted_is_stale_when_its_body_was_one_of_ours(tmp_path, monkeypatch):
  body = _older_body()
  header = ("# Written by pmap-to-shmap: support module v2 "
            f"sha256:{hashlib.sha256(body.encode()).hexdigest()}. Do not edit.\n")
  assert len(header) > 81  # the old, long header
  as_written = header + body
  assert support_module.status_of(as_written) is support_module.Status.STALE  # text hash
  formatted = _formatted(as_written, STYLES["4 spaces, 88"], tmp_path)
  assert formatted.startswith(header)
  # Not a body any v2 copy had: an edit.
  assert support_module.status_of(formatted) is support_module.Status.FOREIGN
  monkeypatch.setattr(support_module, "_V2_TREE_DIGESTS",
                      frozenset({support_module.tree_digest(body)}))
  assert support_module.status_of(formatted) is support_module.Status.STALE
  (tmp_path / NAME).write_text(formatted)
  assert support_module.write(str(tmp_path), "pmap_shard_map")
  assert (tmp_path / NAME).read_text() == support_module.source()


def test_the_last_v2_body_is_known():
  """The last body written under a v2 header (e4948ce's): v3 rewrapped it within 80
  columns without changing its code, so a formatted v2 copy of it is replaced."""
  assert "ed146ce06b105c527c036076" in support_module._V2_TREE_DIGESTS
  assert all(len(d) == 24 and int(d, 16) >= 0 for d in support_module._V2_TREE_DIGESTS)


def test_tree_digest_is_blind_to_layout_only():
  a = 'def f(x, y):\n  """Doc."""\n  return g(x, "a" f"{y}")  # c\n'
  b = "def f(\n    x,\n    y,\n):\n    '''Doc,\n    reworded.'''\n    return g(x, f'a{y}',)\n"
  assert support_module.tree_digest(a) == support_module.tree_digest(b)
  assert support_module.tree_digest(a) != support_module.tree_digest(a.replace("g(x", "g(y"))
  assert support_module.tree_digest("def (") is None


def test_crlf_copy_is_current():
  text = support_module.source().replace("\n", "\r\n")
  assert support_module.status_of(text) is support_module.Status.CURRENT


def test_the_testing_tool_recognises_the_support_module_as_written(tmp_path):
  # pmap_compat.testing finds converted sites by the support module's first line: a new
  # header the tool did not know left every converted site unrecorded.
  from pmap_compat.testing import converted_sites
  path = tmp_path / NAME
  path.write_text(support_module.source({"per_device", "placed_on"}))
  assert converted_sites._support_file(str(path))  # pylint: disable=protected-access
