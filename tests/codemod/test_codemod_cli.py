"""The command line: modes and exit codes, the report, in-place writes, notebooks,
unparsable files, encodings and newline styles, parallel jobs, idempotence."""
import difflib
import json
import os
import subprocess
import sys

import pytest

from codemod import pmap_to_shmap, support_module

# jax 0.6.0 runs the codemod here and the trees declare no jax: copies keep the code a
# shard_map before 0.7.2 needs.
BEFORE_0_7_2 = support_module.SHARD_MAP_BEFORE_0_7_2
# The sites these tests convert are public names, which any call may pass keywords.
KEYWORDS = support_module.KEYWORD_CALLS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SITE = 'import jax\n\n\ndef f(x):\n    return x\n\n\ng = jax.pmap(f, axis_name="i")\n'
PLAIN = "import jax\n\nx = jax.jit(lambda v: v)\n"


def run_cli(*args, capsys):
  code = pmap_to_shmap.main([str(a) for a in args])
  out, err = capsys.readouterr()
  return code, out, err


@pytest.fixture
def tree(tmp_path):
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "site.py").write_text(SITE)
  (tmp_path / "pkg" / "plain.py").write_text(PLAIN)
  return tmp_path


def test_default_prints_a_diff_and_writes_nothing(tree, capsys):
  code, out, err = run_cli(tree, capsys=capsys)
  assert code == 0
  assert out.startswith("--- a/") and "-g = jax.pmap(" in out
  assert '+mesh = jax.sharding.Mesh(jax.devices(), ("i",))' in out
  assert '+g = placed_on(mesh, P("i"))(jax.jit(shard_map(per_device(f),' in out
  assert (tree / "pkg" / "site.py").read_text() == SITE
  assert "INFO pmap converted" in err


def test_report_lines_and_totals(tree, capsys):
  report = tree / "report.txt"
  code, _, err = run_cli(tree, "--report", report, capsys=capsys)
  assert code == 0 and err == ""
  lines = report.read_text().splitlines()
  site_line = os.path.join(str(tree), "pkg", "site.py") + ":8:5 INFO "
  assert any(l.startswith(site_line) for l in lines), lines
  assert lines[-1].startswith("2 files scanned, 1 changed; 1 pmap sites found, 1 converted, 0 reported")


def test_report_dash_goes_to_stdout_after_the_changes(tree, capsys, monkeypatch):
  monkeypatch.chdir(tree)
  code, out, err = run_cli("--check", tree, "--report", "-", capsys=capsys)
  assert code == 1 and err == "" and not (tree / "-").exists()
  assert out.splitlines()[-1].startswith("2 files scanned, 1 changed; 1 pmap sites found")
  _, diff_and_report, _ = run_cli(tree, "--report", "-", capsys=capsys)
  assert diff_and_report.startswith("--- a/") and "INFO pmap converted" in diff_and_report


def test_check_exits_1_when_something_would_change(tree, capsys):
  code, out, _ = run_cli("--check", tree, capsys=capsys)
  assert code == 1 and out == ""
  code, _, _ = run_cli("--check", tree / "pkg" / "plain.py", capsys=capsys)
  assert code == 0


def test_in_place_then_second_run_changes_nothing(tree, capsys):
  code, _, _ = run_cli("--in-place", tree, capsys=capsys)
  assert code == 0
  written = (tree / "pkg" / "site.py").read_text()
  assert "jax.pmap" not in written and "shard_map(per_device(f), mesh=mesh," in written
  assert "from pmap_shard_map import per_device, placed_on" in written
  # The script's own copy, next to it, with what it calls.
  support = (tree / "pkg" / "pmap_shard_map.py").read_text()
  assert support == support_module.source({"per_device", "placed_on", BEFORE_0_7_2, KEYWORDS})
  assert not list((tree / "pkg").glob(".pmap-to-shmap-*"))
  code, out, err = run_cli("--check", tree, capsys=capsys)
  assert code == 0 and out == "", out
  assert "0 pmap sites found" in err


def test_unparsable_file_is_reported_and_skipped(tree, capsys):
  bad = tree / "pkg" / "broken.py"
  bad.write_text("import jax\ng = jax.pmap(f\n")
  code, out, err = run_cli("--in-place", tree, capsys=capsys)
  assert code == 0
  assert bad.read_text() == "import jax\ng = jax.pmap(f\n"
  assert any(l.startswith(str(bad)) and " ERROR cannot parse the file" in l
             for l in err.splitlines()), err


def test_error_sites_leave_the_file_unchanged_and_are_listed(tmp_path, capsys):
  src = "import jax\n\ng = jax.pmap(f, in_axes=-1)\n"
  (tmp_path / "a.py").write_text(src)
  code, out, err = run_cli(tmp_path, capsys=capsys)
  assert code == 0 and out == ""
  assert ":3:5 ERROR pmap left unchanged: negative in_axes -1" in err
  assert "1 pmap sites found, 0 converted, 1 reported; 1 errors" in err


def test_missing_path_exits_2(tmp_path, capsys):
  code, _, err = run_cli(tmp_path / "nope", capsys=capsys)
  assert code == 2 and "no such file" in err


def test_internal_error_exits_2(tree, capsys, monkeypatch):
  from codemod import convert_pmap

  def broken(self, node):
    raise RuntimeError("boom")
  monkeypatch.setattr(convert_pmap.ConvertPmapCommand, "visit_Module", broken)
  code, _, err = run_cli(tree, capsys=capsys)
  assert code == 2 and "internal error, file skipped: RuntimeError: boom" in err


def test_encoding_and_crlf_are_preserved(tmp_path, capsys):
  src = ('# -*- coding: latin-1 -*-\r\nimport jax\r\n\r\nNAME = "caf\xe9"\r\n'
         'g = jax.pmap(f, "i")\r\n')
  path = tmp_path / "latin.py"
  path.write_bytes(src.encode("latin-1"))
  code, _, _ = run_cli("--in-place", path, capsys=capsys)
  assert code == 0
  raw = path.read_bytes()
  text = raw.decode("latin-1")
  assert 'NAME = "caf\xe9"' in text and "jax.jit(" in text
  assert raw.count(b"\n") == raw.count(b"\r\n"), "mixed newlines"


def test_file_mode_is_kept(tmp_path, capsys):
  path = tmp_path / "script.py"
  path.write_text(SITE)
  os.chmod(path, 0o755)
  run_cli("--in-place", path, capsys=capsys)
  assert os.stat(path).st_mode & 0o777 == 0o755


def _notebook(cells):
  return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _code_cell(src):
  return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
          "source": src.splitlines(keepends=True)}


def test_notebook_code_cells_are_converted(tmp_path, capsys):
  nb = _notebook([
      _code_cell("%matplotlib inline\nimport jax\nimport numpy as np"),
      {"cell_type": "markdown", "metadata": {}, "source": ["jax.pmap(f) in prose\n"]},
      _code_cell("!nvidia-smi\nstep = jax.pmap(lambda x: x * 2, axis_name='d')\nstep(np.ones((8, 2)))"),
  ])
  path = tmp_path / "demo.ipynb"
  path.write_text(json.dumps(nb, indent=1))
  code, _, err = run_cli("--in-place", path, capsys=capsys)
  assert code == 0, err
  new = json.loads(path.read_text())
  cells = ["".join(c["source"]) for c in new["cells"]]
  assert cells[0].startswith("%matplotlib inline\nimport jax\nimport numpy as np\n")
  # The support module goes next to the notebook, which imports it with its imports.
  assert cells[0].endswith("\nfrom pmap_shard_map import per_device, placed_on"), cells[0]
  assert support_module.held((tmp_path / "pmap_shard_map.py").read_text().partition("\n")[2]) \
      == {"per_device", "placed_on"}
  assert cells[1] == "jax.pmap(f) in prose\n" and len(cells) == 3
  assert cells[2].startswith("!nvidia-smi\n") and "jax.pmap" not in cells[2]
  assert "placed_on(mesh, P('d'))(" in cells[2]
  # The mesh is built in the site's cell, before the site's statement (not at the end of
  # whichever code cell comes before).
  assert cells[2].startswith("!nvidia-smi\nmesh = jax.sharding.Mesh(jax.devices(), ('d',))\n"
                             "step = placed_on("), cells
  assert "Mesh(" not in cells[0], cells
  assert f"{path}:2:8 INFO cell 3, line 2: pmap converted" in err
  code, _, _ = run_cli("--check", path, capsys=capsys)
  assert code == 0


def test_jobs_give_the_same_result_as_one_process(tmp_path, capsys):
  for i in range(6):
    (tmp_path / f"m{i}.py").write_text(SITE.replace("f", f"f{i}"))
  _, serial, serial_err = run_cli(tmp_path, capsys=capsys)
  _, parallel, parallel_err = run_cli("--jobs", 3, tmp_path, capsys=capsys)
  assert serial == parallel and serial_err == parallel_err


def test_progress_is_shown_for_large_trees(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(pmap_to_shmap, "_PROGRESS_FROM", 3)
  for i in range(4):
    (tmp_path / f"m{i}.py").write_text(PLAIN)
  _, _, err = run_cli(tmp_path, capsys=capsys)
  assert "pmap-to-shmap: 4/4 files" in err


def test_shim_strategy(tmp_path, capsys):
  path = tmp_path / "a.py"
  path.write_text("from jax import pmap\n\ng = pmap(f, axis_name='i')\n")
  code, _, _ = run_cli("--in-place", "--strategy", "shim", path, capsys=capsys)
  assert code == 0
  assert path.read_text() == "import pmap_compat\n\ng = pmap_compat.pmap(f, axis_name='i')\n"


def test_without_a_declared_jax_the_target_follows_the_installed_jax(monkeypatch):
  import importlib.metadata as md

  from codemod import targets
  assert targets.installed_target() == "experimental"  # jax 0.6.0 here
  monkeypatch.setattr(md, "version", lambda name: "0.6.1")
  assert targets.installed_target() == "jax"

  def missing(name):
    raise md.PackageNotFoundError(name)
  monkeypatch.setattr(md, "version", missing)
  assert targets.installed_target() == "jax"


def test_module_entry_point_runs(tree):
  r = subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", "--check", str(tree)],
                     capture_output=True, text=True, cwd=ROOT, timeout=120)
  assert r.returncode == 1, r.stderr
  assert "1 pmap sites found, 1 converted" in r.stderr


def test_byte_order_mark_is_kept(tmp_path, capsys):
  path = tmp_path / "bom.py"
  path.write_bytes(b"\xef\xbb\xbf" + SITE.encode())
  run_cli("--in-place", path, capsys=capsys)
  raw = path.read_bytes()
  assert raw.startswith(b"\xef\xbb\xbfimport jax\nfrom jax.experimental.shard_map import shard_map\n")
  assert b"jax.jit(" in raw


# ----- the support module the converted files import -----

def test_support_module_is_written_next_to_the_script_and_shown_in_the_diff(tree, capsys):
  # pkg/ has no __init__.py: site.py is a script, so it imports a copy next to it (where
  # Python finds it when the script runs).
  code, out, err = run_cli(tree, capsys=capsys)
  assert code == 0
  support = tree / "pkg" / "pmap_shard_map.py"
  assert f"+++ b/{str(support).lstrip(os.sep)}" in out and "--- /dev/null" in out
  assert not support.exists()  # a diff writes nothing
  assert "INFO support module pmap_shard_map written" in err


def test_support_module_location_and_name_follow_the_flags(tree, capsys):
  root = tree / "lib"
  code, _, _ = run_cli("--in-place", "--support-root", root, "--support-module", "shared.smap",
                       tree / "pkg", capsys=capsys)
  assert code == 0
  assert (root / "shared" / "smap.py").read_text() == support_module.source(
      {"per_device", "placed_on", BEFORE_0_7_2, KEYWORDS})
  assert "from shared.smap import per_device, placed_on" in (tree / "pkg" / "site.py").read_text()


def test_stale_support_module_is_replaced(tree, capsys):
  path = tree / "pkg" / "pmap_shard_map.py"
  body = "# an older helper body\n"
  import hashlib
  path.write_text(f"# Written by pmap-to-shmap: support module v1 "
                  f"sha256:{hashlib.sha256(body.encode()).hexdigest()}. Do not edit.\n" + body)
  assert support_module.status_at(str(tree / "pkg"), "pmap_shard_map") is support_module.Status.STALE
  code, _, err = run_cli("--in-place", tree, capsys=capsys)
  assert code == 0 and "updated from an older version" in err
  # An older copy served its files with every flag's code: the new one keeps it.
  assert path.read_text() == support_module.source(
      {"per_device", "placed_on", *support_module.FEATURES})


@pytest.mark.parametrize("content", ["def on_pmap_mesh(*a, **k): ...\n", "EDITED"])
def test_foreign_or_edited_support_module_is_never_overwritten(tree, capsys, content):
  path = tree / "pkg" / "pmap_shard_map.py"
  text = content if content != "EDITED" else support_module.source().replace("import math", "")
  path.write_text(text)
  code, _, err = run_cli("--in-place", tree, capsys=capsys)
  assert code == 2 and "--support-module" in err and "not written by pmap-to-shmap" in err
  assert path.read_text() == text
  assert (tree / "pkg" / "site.py").read_text() == SITE


def test_check_counts_a_missing_support_module_as_a_change(tree, capsys):
  run_cli("--in-place", tree, capsys=capsys)
  (tree / "pkg" / "pmap_shard_map.py").unlink()
  code, _, _ = run_cli("--check", tree, capsys=capsys)
  assert code == 1


# ----- notebooks keep their layout -----

@pytest.mark.parametrize("indent,ensure_ascii,newline", [(2, False, "\n"), (1, True, ""),
                                                          (4, False, "\n")])
def test_notebook_json_layout_is_kept_so_only_changed_cells_differ(
    tmp_path, capsys, indent, ensure_ascii, newline):
  nb = _notebook([
      _code_cell("import jax\nname = 'caf\u00e9 \u2013 \"q\" \\\\ /'"),
      {"cell_type": "markdown", "metadata": {"z": 1, "a": 2}, "source": ["# title \u00e9\n"]},
      _code_cell("step = jax.pmap(lambda x: x * 2, axis_name='d')"),
  ])
  original = json.dumps(nb, indent=indent, ensure_ascii=ensure_ascii) + newline
  path = tmp_path / "layout.ipynb"
  path.write_text(original, encoding="utf-8")
  code, _, err = run_cli("--in-place", path, capsys=capsys)
  assert code == 0, err
  new = path.read_text(encoding="utf-8")
  changed = json.loads(new)
  assert json.dumps(changed, indent=indent, ensure_ascii=ensure_ascii) + newline == new
  # Every changed line is a line of a code cell's source (a string in its "source" list).
  without = json.dumps(changed, indent=indent, ensure_ascii=ensure_ascii) + newline
  changed_lines = [l[2:] for l in difflib.ndiff(original.splitlines(), without.splitlines())
                   if l[:2] in ("- ", "+ ")]
  sources = {line for cell in nb["cells"] + changed["cells"] if cell["cell_type"] == "code"
             for line in cell["source"]}
  assert changed_lines and all(json.loads(l.strip().rstrip(",")) in sources
                               for l in changed_lines), changed_lines
  assert changed["cells"][1] == nb["cells"][1]


def test_myst_markdown_code_cells_are_converted(tmp_path, capsys):
  text = ("---\njupytext:\n  text_representation:\n    format_name: myst\n---\n\n# Title\n\n"
          "Prose mentioning jax.pmap(f).\n\n```{code-cell} ipython3\n:tags: [hide-output]\n"
          "import jax\n```\n\nMore prose.\n\n```{code-cell} ipython3\n"
          "step = jax.pmap(lambda x: x * 2, axis_name='d')\n```\n")
  path = tmp_path / "page.md"
  path.write_text(text)
  code, _, err = run_cli("--in-place", path, capsys=capsys)
  assert code == 0, err
  new = path.read_text()
  assert "Prose mentioning jax.pmap(f)." in new
  assert ":tags: [hide-output]\nimport jax\nfrom jax.experimental.shard_map import shard_map\n" in new
  assert "jax.pmap(lambda" not in new and "placed_on(mesh, P('d'))(" in new
  # The mesh is built in the site's code cell, not at the end of the cell before it.
  assert ("```{code-cell} ipython3\nmesh = jax.sharding.Mesh(jax.devices(), ('d',))\n"
          "step = placed_on(") in new, new
  assert f"{path}:19:8 INFO code cell 2: pmap converted" in err
  assert new.split("```{code-cell} ipython3\nstep")[0].count("\n") > 0
  code, _, _ = run_cli("--check", path, capsys=capsys)
  assert code == 0


def test_plain_markdown_is_left_alone(tmp_path, capsys):
  path = tmp_path / "notes.md"
  path.write_text("Use `jax.pmap(f)`:\n\n```python\ng = jax.pmap(f)\n```\n")
  code, out, _ = run_cli(path, capsys=capsys)
  assert code == 0 and out == ""
