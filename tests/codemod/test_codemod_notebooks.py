"""Notebooks through the command line: IPython syntax recognised where IPython recognises
it (and valid Python never taken for it), nbformat 3, malformed notebooks, and each
cell's line endings and the JSON layout kept, so only the converted cells differ.

The reference for a notebook's conversion is the same code converted as a ``.py`` file;
the reference for where IPython syntax is, IPython's own transformer (recorded in
``recorded/ipython_syntax.json``, and compared live where IPython is installed)."""
from __future__ import annotations

import difflib
import json
import re
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from codemod import ipython_syntax, notebook_support, pmap_to_shmap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORDED = os.path.join(os.path.dirname(__file__), "recorded", "ipython_syntax.json")
SITE = "step = jax.pmap(lambda v: v * 2, axis_name='d')\n"


def _convert(directory: pathlib.Path, name: str, data: bytes) -> tuple[int, bytes, str]:
  """Runs the command line with --in-place on one file; (exit code, the file's bytes,
  the report)."""
  directory.mkdir(parents=True, exist_ok=True)
  path = directory / name
  path.write_bytes(data)
  report = directory / "report.txt"
  code = pmap_to_shmap.main(["--in-place", "--report", str(report), str(path)])
  return code, path.read_bytes(), report.read_text()


def _findings(report: str, path_part: str) -> list[str]:
  """The report's finding lines, without the file name and the notebook's cell label."""
  out = []
  for line in report.splitlines()[:-1]:
    if path_part in line and "support module" not in line:
      out.append(re.sub(r"(worksheet \d+, )?(code )?cell \d+(, line \d+)?: ", "",
                        line.split(":", 1)[1]))
  return out


def _notebook(*sources, **top) -> dict:
  cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
            "source": s} for s in sources]
  return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5, **top}


def _lines(text: str) -> list[str]:
  return text.splitlines(keepends=True)


def _as_py(tmp_path: pathlib.Path, code: str) -> tuple[str, list[str]]:
  """``code`` converted as a .py file: (its new text, its findings). A notebook imports the
  support module next to it as a script does."""
  status, new, report = _convert(tmp_path / "py", "cell.py", code.encode())
  assert status == 0, report
  return new.decode(), _findings(report, "cell.py")


def _user_cells(cells: list[dict]) -> list[dict]:
  """The cells but the support cell the codemod inserts before the first converted one."""
  return [c for c in cells
          if notebook_support.names_in("".join(c.get("source", c.get("input", "")))) is None]


_SUPPORT_BLOCK = re.compile(r"(`{3,}|~{3,})[^\n]*\n# Support code pmap-to-shmap added .*?\n\1\r?\n"
                            r"\r?\n", re.S)


def _without_support_cell(markdown: str) -> str:
  """A markdown notebook without the support code cell the codemod inserts."""
  return _SUPPORT_BLOCK.sub("", markdown, count=1)


def _as_cell(tmp_path: pathlib.Path, code: str) -> tuple[str, list[str]]:
  """``code`` converted as a one-cell notebook: (the cell's new text, its findings)."""
  nb = json.dumps(_notebook(_lines(code)), indent=1).encode()
  status, new, report = _convert(tmp_path / "nb", "cell.ipynb", nb)
  assert status == 0, report
  return ("".join(_user_cells(json.loads(new)["cells"])[0]["source"]),
          _findings(report, "cell.ipynb"))


# ----- valid Python is never IPython syntax -----

LOOKALIKES = {
    "continued_percent_in_brackets": "x = (7\n     % 3)\n",
    "continued_percent_after_backslash": "y = 7 \\\n  % 2\n",
    "question_in_a_comment": "# why?\nz = 1  # and this?\n",
    "lines_inside_a_string": 'doc = """Does it work?\n!maybe\n%s, %d\n"""\n',
    "docstring_ending_in_a_question": "def g():\n  '''Really?'''\n  return 1\n",
    "shell_like_dict_key": "d = {'a': 1,\n     '!b': 2,\n}\n",
}


@pytest.mark.parametrize("lookalike", sorted(LOOKALIKES))
def test_python_that_looks_like_ipython_syntax_converts_as_in_a_py_file(tmp_path, lookalike):
  # Before: any line starting with % or ! or ending in ? was masked, so these cells were
  # unparsable (skipped with an ERROR) or lost the pmap on a `# why?` line.
  code = "import jax\n" + LOOKALIKES[lookalike] + SITE.replace("\n", "  # converted?\n")
  expected, expected_findings = _as_py(tmp_path, code)
  assert "jax.pmap" not in expected
  cell, findings = _as_cell(tmp_path, code)
  assert cell == expected
  assert findings == expected_findings


def test_ipython_syntax_is_kept_verbatim_and_the_python_around_it_converted(tmp_path):
  magic_lines = ["%matplotlib inline\n", "files = !ls -l\n", "!echo one \\\n  two\n",
                 "t = %time 1 + 1\n", "jax.pmap?\n", "??jax.pmap\n", "%load_ext autoreload\n"]
  # (The imports come first: a statement between imports moves where the codemod adds its
  # own import, in a .py file too.)
  python = ["import jax\nimport numpy as np\n", "x = np.ones((8, 2))\n", SITE, "y = step(x)\n",
            "print(y.shape)\n", "z = (1 +\n     2)\n", "w = -1\n"]
  cell = "".join(p + m for p, m in zip(python, magic_lines, strict=True))
  converted, _ = _as_cell(tmp_path, cell)
  expected, _ = _as_py(tmp_path, "".join(python))
  for magic in magic_lines:
    assert converted.count(magic) == 1, magic
  positions = [converted.index(m) for m in magic_lines]
  assert positions == sorted(positions)
  without = converted
  for magic in magic_lines:
    without = without.replace(magic, "")
  assert without == expected


def test_magics_inside_blocks_keep_the_block_parsable(tmp_path):
  # A masked magic must leave a statement behind: an `if` whose body is only a magic
  # (or an assignment from one) still parses, and the pmap after it is converted as in
  # a .py file with plain statements in the magics' places.
  stand_ins = {"    %time 1\n": "    pass\n", "    out = !pwd\n": "    out = None\n",
               "    !echo $i\n": "    i += 0\n"}
  magics = list(stand_ins)
  cell = (f"import jax\nif True:\n{magics[0]}else:\n{magics[1]}for i in range(2):\n{magics[2]}"
          + SITE)
  converted, findings = _as_cell(tmp_path, cell)
  plain = cell
  for magic, stand_in in stand_ins.items():
    assert converted.count(magic) == 1, magic
    converted, plain = converted.replace(magic, stand_in), plain.replace(magic, stand_in)
  expected, expected_findings = _as_py(tmp_path, plain)
  assert converted == expected and findings == expected_findings
  assert "jax.pmap" not in converted


def test_cell_magics_are_recognised_only_on_the_first_line(tmp_path):
  python_body = "%%time\nimport jax\n" + SITE
  opaque = "%%bash\necho jax.pmap(\n"
  writefile = "%%writefile train.py\nimport jax\n" + SITE
  nb = _notebook(_lines(python_body), _lines(opaque), _lines(writefile))
  code, new, report = _convert(tmp_path, "cells.ipynb", json.dumps(nb, indent=1).encode())
  assert code == 0, report
  cells = ["".join(c["source"]) for c in _user_cells(json.loads(new)["cells"])]
  body, _ = _as_py(tmp_path / "body", python_body.split("\n", 1)[1])
  assert cells[0] == "%%time\n" + body
  assert cells[1] == opaque and cells[2] == writefile  # not Python: left alone
  not_first = 'import jax\nx = """\n%%time\n"""\n' + SITE  # in a string, not a cell magic
  assert _as_cell(tmp_path / "string", not_first) == _as_py(tmp_path / "string", not_first)


CORPUS = [
    "%time f()\n", "x = (1 +\n     % 3)\n", "y = 7 \\\n  % 2\n", "# why?\n", "x = 1  # why?\n",
    'doc = """Does it?\n!maybe\n%no\n"""\n', "a = !ls\n", "a = %time f()\n", "a =  !ls -l\n",
    "!!ls\n", "??x\n", "x??\n", "x?\n", "x.y[0]?\n", "%timeit?\n", "%%timeit?\n", "  !ls\n",
    "if x:\n    %time f()\n    y = 1\n", "if x:\n    !ls\nelse:\n    a = !pwd\n",
    "!echo a \\\n  b \\\n  c\nz = 1\n", "x = (a\n     ?)\n", "f(1,\n  2)?\n", "a = b?\n",
    "%matplotlib inline\nimport jax\n", "/f a b\n", "/ f\n", ",f a b\n", ";f a b\n",
    "x = {'a': 1,\n     '%': 2}\n", "print(1)\n!ls\n%pwd\nx = 2\n", "a = b = %time 1\n",
    "d[a == b] = !ls\n", "f(x=%time)\n", "x = 5 % 3\n", "s = '%s' % x\n",
    "!echo \"it's\"\nz?\n", "a = \\\n%time f()\n", "x ?\n", "x = 1\n?\n",
    "def f():\n    '''why?'''\n    return 1\n", "%%bash\necho hi\n", "\n%%time\nx = 1\n",
    "l = [\n%x\n]\n", "= !ls\n", "a = %\n", "a = % 3\n", "x = (\n", "!ls -l | grep \"x\n",
    "%load_ext autoreload\n%autoreload 2\n", "for i in range(3):\n    !echo $i\n",
    "f'{x!r}'\n", "x != !y\n", "x[1] = !ls\n", "a = !ls\nb = %pwd\nc?\n!!pwd\n",
    "%%writefile a.py\nimport jax\n", "x = 1 \\\n  ?\n", "print('a')?\n", "%%\n",
    "if x:\n  y = 1\n%time z\n", "x = '''\n''' ; !ls\n", "(!ls)\n", "a: int = !ls\n",
    "a += !ls\n", "a, b = %time 1, 2\n", "lambda x=!ls: x\n", "%time \\\n  f()\n",
    'x = f"{a=}"\n', 'f"{a}?"\n', 'f"""\n!x\n%y\n"""\n', 'a = f"{b!r}" ; c?\n',
    'x = f"{a}" \\\n  % 3\n', 'f"{a:{b}}?"\n', 'y = f"{1:%}"\n',
]


def _spans(found) -> list[list]:
  return [[m.start, m.stop, m.prefix] for m in found]


def _ipython_transformer():
  """IPython's transformer module, or None where IPython is not installed."""
  try:
    from IPython.core import inputtransformer2
  except ImportError:
    return None
  return inputtransformer2


def test_own_rules_find_what_ipythons_transformer_finds():
  """Our rules (used where IPython is not installed) against IPython's transformer on the
  corpus: as recorded with IPython, and live wherever IPython is installed. Re-record with
  IPython importable: RECORD_IPYTHON_SYNTAX=1 python -m pytest THIS_FILE -k own_rules."""
  own = {cell: _spans(ipython_syntax.own_magics(_lines(cell))) for cell in CORPUS}
  transformer = _ipython_transformer()
  if os.environ.get("RECORD_IPYTHON_SYNTAX"):
    assert transformer is not None, "recording needs IPython"
    import IPython
    record = {"ipython": IPython.__version__, "python": sys.version.split()[0],
              "cells": [{"cell": c,
                         "spans": _spans(ipython_syntax.ipython_magics(_lines(c), transformer)),
                         "ipython_transform": transformer.TransformerManager().transform_cell(c)}
                        for c in CORPUS]}
    os.makedirs(os.path.dirname(RECORDED), exist_ok=True)
    with open(RECORDED, "w", encoding="utf-8") as f:
      json.dump(record, f, indent=1)
      f.write("\n")
  with open(RECORDED, encoding="utf-8") as f:
    recorded = {entry["cell"]: entry["spans"] for entry in json.load(f)["cells"]}
  assert set(recorded) == set(CORPUS), "re-record: the corpus changed"
  assert own == recorded
  assert sum(bool(s) for s in own.values()) > len(CORPUS) // 2  # the corpus has syntax to find
  if transformer is not None:
    assert own == {cell: _spans(ipython_syntax.ipython_magics(_lines(cell), transformer))
                   for cell in CORPUS}


# ----- nbformat 3, other kernels, malformed notebooks -----

def _v3(*cells, **top) -> dict:
  return {"metadata": {"name": "old"}, "nbformat": 3, "nbformat_minor": 0,
          "worksheets": [{"cells": list(cells), "metadata": {}}], **top}


def _v3_code(source: list[str], language: str = "python") -> dict:
  return {"cell_type": "code", "collapsed": False, "input": source, "language": language,
          "metadata": {}, "outputs": [], "prompt_number": 1}


def test_nbformat3_notebook_is_converted_like_the_same_nbformat4_one(tmp_path):
  # Before: cells under worksheets were never read, so a pmap there passed silently.
  sources = [["%matplotlib inline\n", "import jax"], ["!nvidia-smi\n", SITE.rstrip("\n")]]
  heading = {"cell_type": "heading", "level": 1, "metadata": {}, "source": ["jax.pmap"]}
  other = _v3_code(["step = jax.pmap(f)"], language="julia")
  v3 = _v3(_v3_code(sources[0]), heading, _v3_code(sources[1]), other)
  original = json.dumps(v3, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
  code, new, report = _convert(tmp_path / "v3", "old.ipynb", original.encode())
  assert code == 0, report
  _, new4, report4 = _convert(tmp_path / "v4", "old.ipynb",
                              json.dumps(_notebook(*sources), indent=1).encode())
  converted = json.loads(new)
  cells = _user_cells(converted["worksheets"][0]["cells"])
  assert [cells[0]["input"], cells[2]["input"]] == [
      c["source"] for c in _user_cells(json.loads(new4)["cells"])]
  assert cells[1] == heading and cells[3] == other  # not Python code: left alone
  assert converted["nbformat"] == 3 and "cells" not in converted
  assert json.dumps(converted, indent=1, sort_keys=True, ensure_ascii=False) + "\n" == new.decode()
  assert _findings(report, "old.ipynb") == _findings(report4, "old.ipynb")
  assert pmap_to_shmap.main(["--check", str(tmp_path / "v3" / "old.ipynb")]) == 0


def test_a_notebook_of_another_language_is_left_alone(tmp_path):
  julia = _notebook(["using Distributed\n", "pmap(x -> x^2, 1:10)\n"],
                    metadata={"language_info": {"name": "julia"}})
  original = json.dumps(julia, indent=1).encode()
  code, new, report = _convert(tmp_path, "julia.ipynb", original)
  assert (code, new) == (0, original) and "ERROR" not in report


MALFORMED = {
    "a_json_array": (b"[1, 2]", "the top level is an array, expected an object"),
    "source_an_int": (json.dumps(_notebook(5)).encode(), "cell 1: 'source' is a number"),
    "source_a_list_of_ints": (json.dumps(_notebook([1])).encode(), "cell 1: 'source' is an array"),
    "cells_an_object": (b'{"cells": {}, "nbformat": 4}', "'cells' is an object, expected an array"),
    "no_cells": (b'{"nbformat": 4}', "no 'cells', expected an array of cells"),
    "a_cell_a_string": (b'{"cells": ["x"], "nbformat": 4}', "cell 1 is a string, expected an object"),
    "no_cell_type": (b'{"cells": [{"source": ""}], "nbformat": 4}', "cell 1 has no 'cell_type'"),
    "worksheets_a_string": (b'{"worksheets": "x", "nbformat": 3}', "'worksheets' is a string"),
    "v3_input_missing": (json.dumps(_v3({"cell_type": "code"})).encode(),
                         "worksheet 1, cell 1: no 'input'"),
    "not_json": (b'{"cells": [', "not JSON (Expecting value"),
    "not_utf8": (b'{"cells": [], "x": "caf\xe9"}', "not UTF-8"),
}


def test_malformed_notebooks_are_error_findings_and_the_run_goes_on(tmp_path):
  # Before: a JSON array or an int source was an internal error (exit 2).
  for name, (data, _) in MALFORMED.items():
    (tmp_path / f"{name}.ipynb").write_bytes(data)
  (tmp_path / "good.py").write_text("import jax\n" + SITE)
  run = subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", "--in-place", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
  assert run.returncode not in (pmap_to_shmap.EXIT_INTERNAL_ERROR,
                                pmap_to_shmap.EXIT_CHANGES_PENDING), run.stderr
  assert "Traceback" not in run.stderr and "internal error" not in run.stderr
  for name, (data, message) in MALFORMED.items():
    path = tmp_path / f"{name}.ipynb"
    line = f"{path}:1:1 ERROR not a readable notebook: "
    assert any(l.startswith(line) and message in l for l in run.stderr.splitlines()), (
        name, run.stderr)
    assert path.read_bytes() == data
  assert "jax.pmap" not in (tmp_path / "good.py").read_text()


def test_a_cell_that_does_not_parse_is_named_with_its_own_line(tmp_path):
  # jax-md's cookbook: libcst's message counted the line in the joined cells ("@ 8:3").
  nb = _notebook(["import jax\n"], [SITE], ["x = jax.pmap\n", "  y = 2\n"])
  code, new, report = _convert(tmp_path, "nb.ipynb", json.dumps(nb).encode())
  assert code == 0 and json.loads(new) == nb
  [line] = [l for l in report.splitlines() if "cannot parse" in l]
  assert line.endswith(" ERROR cell 3, line 2: cannot parse the file, skipped: Syntax Error")


@pytest.mark.parametrize("kind", ["ipynb", "md"])
def test_a_cell_of_pseudo_code_without_pmap_is_left_and_the_rest_converted(tmp_path, kind):
  # Jupyter parses each cell alone: a document's pseudo-code cell (blackjax's docs) does
  # not keep the sites of the other cells from being converted.
  pseudo = "for step in range(...):\n    state = update(state) ???\n"
  cells = ["import jax\n", pseudo, SITE]
  if kind == "ipynb":
    data = json.dumps(_notebook(*cells)).encode()
  else:
    data = "".join(f"```{{code-cell}} python\n{c}```\n\n" for c in cells).encode()
    data = b"---\njupytext:\n  text_representation:\n    format_name: myst\n---\n\n" + data
  code, new, report = _convert(tmp_path, f"doc.{kind}", data)
  assert code == 0, report
  text = new.decode()
  assert "jax.pmap" not in text and "shard_map(" in text, text
  if kind == "md":
    assert pseudo in text, text
  else:
    assert "".join(json.loads(text)["cells"][1]["source"]) == pseudo, text
  infos = [line for line in report.splitlines() if "does not parse" in line]
  assert len(infos) == 1 and " INFO " in infos[0] and "cell 2" in infos[0], report
  assert "ERROR" not in report, report
  support = (tmp_path / "pmap_shard_map.py").read_text()
  assert "def per_device(" in support and "def placed_on(" in support, support


def test_a_cell_that_does_not_parse_and_holds_a_pmap_stops_the_conversion(tmp_path):
  nb = _notebook(["import jax\n"], ["f = jax.pmap(g) ???\n"], [SITE])
  code, new, report = _convert(tmp_path, "nb.ipynb", json.dumps(nb).encode())
  assert code == 0 and json.loads(new) == nb
  [line] = [l for l in report.splitlines() if "ERROR" in l]
  assert "cell 2, line 1: cannot parse" in line, report


@pytest.mark.parametrize("first_cell", ["import jax\n",
                                        "import jax\n\n\ndef start():\n  jax.distributed.initialize()\n"],
                         ids=["plain", "made_on_first_call"])
def test_a_cell_that_starts_with_a_decorated_site_keeps_its_mesh(tmp_path, first_cell):
  # The mesh goes before the def, after the cell's boundary: it was dropped (the boundary
  # was written twice), or, made by a function, moved with the def into the cell above.
  cells = [first_cell, "x = 1\n", "@jax.pmap\ndef f(v):\n  return v * 2\n"]
  code, new, report = _convert(tmp_path, "nb.ipynb", json.dumps(_notebook(*cells)).encode())
  assert code == 0, report
  sources = ["".join(c["source"]) for c in json.loads(new)["cells"]]
  assert sources[1] == "x = 1\n", sources
  assert "mesh" in sources[2] and "def f(v):" in sources[2], sources
  assert not sources[2].startswith("\n"), sources
  namespace: dict = {}
  here = os.getcwd()
  os.chdir(tmp_path)  # where the kernel runs: the support module is beside the notebook
  sys.path.insert(0, str(tmp_path))
  try:
    for source in sources:
      exec(compile(source, "cell", "exec"), namespace)  # pylint: disable=exec-used
  finally:
    sys.path.remove(str(tmp_path))
    sys.modules.pop("pmap_shard_map", None)
    os.chdir(here)
  assert ("def mesh():" in sources[2]) == ("initialize" in first_cell), sources
  x = np.arange(jax.device_count() * 2.0).reshape(-1, 2)
  np.testing.assert_array_equal(namespace["f"](x), jax.pmap(lambda v: v * 2)(x))


# ----- line endings and the JSON layout -----

def test_crlf_cells_keep_their_line_endings(tmp_path):
  # Before: every code cell came back with \n endings, untouched cells included.
  imports = ["import jax\r\n", "import numpy as np\r\n", "x = np.ones((8, 2))"]  # + new imports
  site = ["%time 1\r\n", SITE.replace("\n", "\r\n"), "y = step(x)\r\n", "z = 1"]
  mixed = ["a = 1\r\n", "b = 2\n", "c = 3\r", "d = 4"]
  untouched = ["w = 1\r\n", "v = [\r\n", "  1]\r\n"]
  nb = _notebook(imports, site, mixed, untouched)
  original = json.dumps(nb, indent=1).encode()
  code, new, report = _convert(tmp_path / "crlf", "nb.ipynb", original)
  assert code == 0, report
  cells = [c["source"] for c in _user_cells(json.loads(new)["cells"])]
  assert cells[2:] == [mixed, untouched]
  for old, now in zip([imports, site], cells[:2], strict=True):
    assert now != old and all(l.endswith("\r\n") for l in now[:-1]) and now[-1] == old[-1]
  # The same notebook with \n endings (the other cells too: they set the layout's style).
  lf = _notebook(*[[l.replace("\r\n", "\n") for l in c]
                   for c in (imports, site, mixed, untouched)])
  _, new_lf, _ = _convert(tmp_path / "lf", "nb.ipynb", json.dumps(lf, indent=1).encode())
  assert [[l.replace("\r\n", "\n") for l in c] for c in cells[:2]] == [
      c["source"] for c in _user_cells(json.loads(new_lf)["cells"])[:2]]
  # In the file itself, only lines of the changed cells' sources differ (the support cell
  # inserted before the converted one aside).
  converted = json.loads(new)
  assert json.dumps(converted, indent=1).encode() == new
  without = json.dumps(dict(converted, cells=_user_cells(converted["cells"])), indent=1)
  changed_lines = [l[2:] for l in difflib.ndiff(original.decode().splitlines(),
                                                without.splitlines()) if l[:2] in ("- ", "+ ")]
  assert changed_lines and all(json.loads(l.strip().rstrip(",")) in imports + site + cells[0]
                               + cells[1] for l in changed_lines), changed_lines


@pytest.mark.parametrize("layout", [
    {"indent": 1}, {"indent": 2, "ensure_ascii": False}, {"indent": "\t"},
    {"indent": 4, "sort_keys": True}, {"separators": (",", ":")}, {}, {"indent": 0},
    {"indent": 2, "separators": (", ", ": ")}])
@pytest.mark.parametrize("crlf,bom,trailing", [(False, False, "\n"), (True, True, "\r\n"),
                                               (False, False, "")])
def test_json_layout_is_kept_so_only_the_changed_cell_differs(tmp_path, layout, crlf, bom,
                                                               trailing):
  nb = _notebook(["s = 'caf\u00e9 \\u2013 \"q\"'"], ["x = 1"], _lines("import jax\n" + SITE),
                 metadata={"z": 1, "a": {"k": "\u00e9"}})
  nb["cells"].insert(1, {"cell_type": "markdown", "metadata": {}, "source": ["# t\u00edtulo"]})
  def dump(value) -> bytes:
    text = json.dumps(value, **layout)
    text = (text.replace("\n", "\r\n") if crlf else text) + trailing
    return (b"\xef\xbb\xbf" if bom else b"") + text.encode()
  original = dump(nb)
  code, new, report = _convert(tmp_path, "layout.ipynb", original)
  assert code == 0, report
  converted = json.loads(new.decode("utf-8-sig"))
  assert dump(converted) == new
  assert converted["cells"][1:3] == nb["cells"][1:3]
  # Only lines of code cells' sources differ (the imports go to the first cell).
  sources = {l for c in nb["cells"] + converted["cells"] if c["cell_type"] == "code"
             for l in c["source"]}
  if layout.get("indent") is not None:
    # (The support cell inserted before the converted one aside.)
    without = dump(dict(converted, cells=_user_cells(converted["cells"])))
    changed_lines = [l[2:] for l in difflib.ndiff(original.decode("utf-8-sig").splitlines(),
                                                  without.decode("utf-8-sig").splitlines())
                     if l[:2] in ("- ", "+ ")]
    assert changed_lines and all(json.loads(l.strip().rstrip(",")) in sources
                                 for l in changed_lines), changed_lines


# ----- MyST / jupytext markdown -----

def test_markdown_notebook_keeps_line_endings_and_ipython_syntax(tmp_path):
  # Before: every code cell came back with \n endings; `% 3` and `# why?` were masked.
  head = ("---\r\njupytext:\r\n  text_representation:\r\n    format_name: myst\r\n---\r\n"
          "\r\nProse with jax.pmap(f).\r\n\r\n```{code-cell} ipython3\r\n")
  first = "%matplotlib inline\nimport jax\nx = (7\n     % 3)  # why?\n" + SITE
  tail = "```\r\n\r\n```{code-cell} ipython3\r\n!nvidia-smi\r\ny = 2\r\n```\r\n"
  text = head + first.replace("\n", "\r\n") + tail
  code, new, report = _convert(tmp_path / "md", "page.md", text.encode())
  assert code == 0, report
  new_text = _without_support_cell(new.decode())
  assert new_text.startswith(head) and new_text.endswith(tail)  # prose, fences, cell 2
  cell, findings = _as_cell(tmp_path, first)
  assert "jax.pmap" not in cell
  assert new_text[len(head):-len(tail)] == cell.replace("\n", "\r\n")
  # The same findings as the cell's, at the markdown file's lines.
  assert [f.split(" ", 1)[1] for f in _findings(report, "page.md")] == [
      f.split(" ", 1)[1] for f in findings]


def test_markdown_cells_of_another_kernel_are_left_alone(tmp_path):
  julia = "```{code-cell} julia\npmap(x -> x^2, 1:10)\n```\n"
  python = "```{code-cell} python3\nimport jax\n" + SITE + "```\n"
  code, new, report = _convert(tmp_path / "md", "mixed.md", (julia + "\n" + python).encode())
  assert code == 0 and "ERROR" not in report, report
  assert new.decode().startswith(julia + "\n")
  assert "jax.pmap" not in _without_support_cell(new.decode())


def test_pmap_inside_ipython_syntax_is_reported_not_silently_left(tmp_path):
  cells = [["import jax\n", "%time out = jax.pmap(lambda v: v + 1)(x)\n", "jax.pmap?\n"],
           ["%%writefile job.py\n", "step = jax.pmap(f)\n"],
           ["import numpy as np\n", "x = np.ones((8, 2))\n", SITE]]
  nb = json.dumps(_notebook(*cells), indent=1).encode()
  status, new, report = _convert(tmp_path, "hidden.ipynb", nb)
  assert status == 0, report
  hidden = [l for l in report.splitlines() if "pmap inside IPython syntax" in l]
  assert [l.split(":")[1:3] for l in hidden] == [["2", "1 WARNING cell 1, line 2"],
                                                ["1", "1 WARNING cell 2, line 1"]]
  cells_after = ["".join(c["source"]) for c in _user_cells(json.loads(new)["cells"])]
  assert cells_after[:2] == ["".join(c) for c in cells[:2]]  # left exactly as they were
  assert "jax.pmap(" not in cells_after[2]  # the visible site is converted


# ----- automagics, and where findings point -----

def _mixed_notebook(*cells) -> dict:
  """Cells given as ("markdown" | "code", source)."""
  return {"cells": [{"cell_type": kind, "metadata": {}, "source": source,
                     **({"execution_count": None, "outputs": []} if kind == "code" else {})}
                    for kind, source in cells],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_automagic_cell_is_kept_and_the_rest_converted(tmp_path):
  # JAX's cloud_tpu_colabs/JAX_demo.ipynb times with `timeit f(x)`: IPython runs a one-line
  # cell whose first word is an unshadowed line magic as that magic.
  cells = [("markdown", "# Demo"),
           ("code", "import jax\nimport jax.numpy as jnp\nx = jnp.ones((8, 3))"),
           ("markdown", "Time it:"),
           ("code", "timeit jnp.dot(x, x.T).block_until_ready()"),
           ("code", "f = jax.pmap(lambda v: v * 2)\ny = f(x)")]
  code, new, report = _convert(tmp_path, "demo.ipynb", json.dumps(_mixed_notebook(*cells)).encode())
  assert code == 0, report
  assert "ERROR" not in report, report
  out = _user_cells(json.loads(new)["cells"])
  assert "".join(out[3]["source"]) == "timeit jnp.dot(x, x.T).block_until_ready()"
  assert "jax.pmap" not in "".join(out[4]["source"])
  # The finding names the notebook's own cell (markdown cells count) and the line in it.
  assert "cell 5, line 1: pmap converted" in report, report


@pytest.mark.parametrize("cell", [
    "timeit = 3",                       # an assignment to the name
    "import time\ntime(1)",            # several lines: IPython's prefilter does not run
    "len(x)",                           # not a magic's name
])
def test_python_that_starts_with_a_magic_name_is_python(cell):
  from codemod import ipython_syntax
  lines = [line + "\n" for line in cell.split("\n")]
  assert ipython_syntax.magics(lines) == []


def test_a_name_the_notebook_defines_shadows_the_automagic():
  from codemod import notebook
  code = notebook._cell_code(["def time(x):\n  return x\n", "time (1)\n"])
  assert code.magics == []
  code = notebook._cell_code(["x = 1\n", "time (1)\n"])
  assert code.magics == ["time (1)\n"]


def test_unparsable_cell_is_reported_at_its_cell_and_line(tmp_path):
  cells = [("markdown", "intro"), ("code", "import jax"), ("markdown", "more"),
           ("code", "x = jax.pmap\ny = (\n")]
  code, _, report = _convert(tmp_path, "broken.ipynb", json.dumps(_mixed_notebook(*cells)).encode())
  errors = [line for line in report.splitlines() if "ERROR" in line]
  assert len(errors) == 1 and "cell 4, line " in errors[0], report
