"""Measures the codemod against its acceptance metrics on the pmap-using code here.

  .venv/bin/python tools/codemod_corpus.py [--json FILE] [--workdir DIR] [--only NAME ...]

The corpus, each copied into a temporary repository (a ``.git`` marks its root; the
sources are never touched): the installed flax, brax, numpyro, optax and orbax of
``.venv-real-jax0.6.0`` (and of ``.venv-real-jax0.10.2`` where the tree differs), each
with its repository's configuration files (pyproject.toml, setup.cfg, ruff.toml,
.pre-commit-config.yaml, ...) from the same release's sdist on PyPI, since an installed
package keeps none (without PyPI, the copy has none: the row says so), JAX's
``tests/pmap_test.py`` with its ``pyproject.toml`` at v0.6.0 and v0.10.2
(``../shared/jax_tests`` beside the repository), this project's ``examples/`` with its
``pyproject.toml``, and whole repositories as released on PyPI (RELEASES): the full
extracted tree of the sdists of kfac-jax, jaxline, dm-haiku, chex, dm-acme, jraph,
jumanji, evojax, neural-tangents, rlax, trax, diffusers, equinox, blackjax, evosax,
fedjax and flashbax (sources, tests, examples and configuration files as shipped; rows
"NAME VERSION (sdist)"), and objax, qdax and clu, which PyPI serves only as wheels, from
their wheels (their package files only; "objax 1.8.0 (wheel)").
Those are downloaded only when selected (``--only sdist wheel`` selects just them), once,
into the sdist cache; without PyPI, the row says "not downloaded" and is not measured.

Per repository, after ``python -m codemod.pmap_to_shmap ROOT --in-place --report FILE``:
files scanned and sites found / converted / reported (the report's totals line), crashes
(report lines saying "internal error", or exit status 2), parse failures ("cannot parse" or
"cannot decode"), non-idempotent files (a second run with ``--check`` must exit 0; if not,
the files its ``--diff`` names), lost comments (the multiset of ``#`` comment tokens of
each original file minus the converted file's), new ruff F findings (``ruff check --select
F`` before vs after, counted by file and code, line numbers ignored; a new file's findings
are all new), files that lose their formatter check (where the repository configures
ruff, black or pyink and it is installed, ``codemod.repo_formatter``: a changed file that formatter left unchanged
before and changes after; a new support module that formatter changes, where it left one
of the changed files unchanged before), new I001
findings (the same with ``--select I001`` where the copied tree's ruff configuration
selects it, else the files ``isort --check-only`` finds unsorted with the tree's isort
configuration, else "n/a"; and the same under ruff's
default isort settings in every repository: a file those settings find unsorted before
counts only where it gets more findings), added lines longer than the file's limit
(``codemod.file_style.detect`` on the original; for a new support module the
repository's configured limit, else 80; added lines from a difflib comparison), the
support modules written (``pmap_shard_map.py`` / ``_pmap_shard_map.py``: lines and copies),
the support cells added to notebooks (lines), and the share of sites converted. Row-access
rewrites (``first_row`` / ``first_rows``) are counted for a reader to check: whether one is
a false rewrite is not decided here.

Prints a markdown table (one row per repository and a total row) and up to two examples
per non-zero metric and repository; ``--json FILE`` writes the rows with every finding.
"""
from __future__ import annotations

import argparse
import collections
import configparser
import difflib
import filecmp
import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tokenize
import tomllib
import zipfile
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from codemod import file_style, repo_formatter  # noqa: E402

RUFF = os.path.join(ROOT, ".venv", "bin", "ruff")
ISORT = os.path.join(ROOT, ".venv", "bin", "isort")
JAX_TESTS = os.path.join(os.path.dirname(ROOT), "shared", "jax_tests")
PACKAGES = ("flax", "brax", "numpyro", "optax", "orbax")
SUPPORT_FILES = ("pmap_shard_map.py", "_pmap_shard_map.py")
NOTEBOOK_SUPPORT = "# Support code pmap-to-shmap added"
TOTALS_RE = re.compile(r"(\d+) files scanned, (\d+) changed; (\d+) pmap sites found, "
                       r"(\d+) converted, (\d+) reported")
ROW_RE = re.compile(r"rewritten to first_rows?\(")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")
# The files at a repository's root that configure its tools and declare its requirements.
CONFIG_FILES = ("pyproject.toml", "setup.cfg", "setup.py", "ruff.toml", ".ruff.toml",
                ".pre-commit-config.yaml", "pylintrc", ".pylintrc", ".editorconfig",
                "tox.ini", ".flake8", ".isort.cfg", ".style.yapf", "requirements.txt")
SDISTS = os.path.join(tempfile.gettempdir(), "codemod-corpus-sdists")
# Whole repositories as released: (project, version, kind), "sdist" for its full tree,
# "wheel" where PyPI serves none (its package files only, no configuration).
RELEASES = (("kfac-jax", "0.0.8", "sdist"), ("jaxline", "0.0.8", "sdist"),
            ("dm-haiku", "0.0.17", "sdist"), ("chex", "0.1.92", "sdist"),
            ("dm-acme", "0.4.0", "sdist"), ("jraph", "0.0.6.dev0", "sdist"),
            ("jumanji", "1.1.2", "sdist"), ("evojax", "0.2.17", "sdist"),
            ("neural-tangents", "0.6.5", "sdist"), ("rlax", "0.1.9", "sdist"),
            ("trax", "1.4.1", "sdist"), ("objax", "1.8.0", "wheel"),
            ("diffusers", "0.31.0", "sdist"), ("equinox", "0.12.2", "sdist"),
            ("blackjax", "1.2.4", "sdist"), ("evosax", "0.1.6", "sdist"),
            ("fedjax", "0.0.17", "sdist"), ("flashbax", "0.1.3", "sdist"),
            ("qdax", "0.5.0", "wheel"), ("clu", "0.0.12", "wheel"))


@dataclass
class Repo:
  name: str
  parts: list[tuple[str, str]]  # (source path, path inside the repository)
  # A release from RELEASES whose files become the parts once the repository is selected,
  # so that measuring others downloads nothing.
  release: tuple[str, str, str] | None = None


@dataclass
class Row:
  name: str
  files: int = 0
  found: int = 0
  converted: int = 0
  reported: int = 0
  crashes: int = 0
  parse_failures: int = 0
  non_idempotent: int = 0
  lost_comments: int = 0
  new_f: int = 0
  new_i001: int | None = None  # None: the repository does not sort imports
  new_i001_defaults: int = 0  # the same under ruff's default isort settings, everywhere
  long_added: int = 0
  format_lost: int | None = None  # None: the repository configures no ruff or black
  support_lines: int = 0
  support_copies: int = 0
  notebook_support_lines: int = 0
  row_rewrites: int = 0
  examples: dict[str, list[str]] = field(default_factory=lambda: collections.defaultdict(list))

  @property
  def share(self) -> float:
    return self.converted / self.found if self.found else 1.0


def corpus() -> list[Repo]:
  repos = []
  sites = {v: os.path.join(ROOT, f".venv-real-jax{v}", "lib", "python3.11", "site-packages")
           for v in ("0.6.0", "0.10.2")}
  for package in PACKAGES:
    for venv, site in sites.items():
      source = os.path.join(site, package)
      if venv != "0.6.0" and _same_tree(source, os.path.join(sites["0.6.0"], package)):
        continue
      dist = glob.glob(os.path.join(site, f"{package}*.dist-info"))
      project, version = (os.path.basename(dist[0]).removesuffix(".dist-info").split("-")
                          if dist else (package, "?"))
      config = repository_config(project, version)
      repos.append(Repo(f"{package} {version} (venv jax{venv}"
                        f"{'' if config else ', no configuration'})",
                        [(source, package), *config]))
  for tag in ("v0.6.0", "v0.10.2"):
    base = os.path.join(JAX_TESTS, tag)
    repos.append(Repo(f"jax {tag} tests/pmap_test.py",
                      [(os.path.join(base, "tests", "pmap_test.py"), "tests/pmap_test.py"),
                       (os.path.join(base, "pyproject.toml"), "pyproject.toml")]))
  repos.append(Repo("pmap-compat examples/", [(os.path.join(ROOT, "examples"), "examples"),
                                              (os.path.join(ROOT, "pyproject.toml"),
                                               "pyproject.toml")]))
  repos += [Repo(f"{project} {version} ({kind})", [], (project, version, kind))
            for project, version, kind in RELEASES]
  return repos


def fetch(repo: Repo) -> None:
  """Fills in the parts of a ``release`` repository: the top-level entries of its tree; or,
  where pip cannot get it, says so in its name."""
  if repo.release is None:
    return
  project, version, kind = repo.release
  tree = release_tree(project, version, kind)
  if tree is None:
    repo.name = f"{project} {version} ({kind}, not downloaded)"
  else:
    repo.parts = [(os.path.join(tree, name), name) for name in sorted(os.listdir(tree))]


def download(project: str, version: str, kind: str) -> str | None:
  """The sdist (``kind`` "sdist") or wheel of ``project`` at ``version`` in SDISTS,
  downloaded there unless a previous run did; None where pip cannot get it."""
  prefix = f"{project}_{version}{'.' if kind == 'sdist' else '_'}".lower().replace("-", "_")
  suffix = ".tar.gz" if kind == "sdist" else ".whl"

  def cached() -> str | None:
    # sdist names keep the project's "-" or use "_"; wheel names always use "_".
    return next((a for a in sorted(glob.glob(os.path.join(SDISTS, f"*{suffix}")))
                 if os.path.basename(a).lower().replace("-", "_").startswith(prefix)), None)

  if (archive := cached()) is not None:
    return archive
  try:
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--only-binary" if kind == "wheel" else "--no-binary", ":all:", "--dest",
                    SDISTS, f"{project}=={version}"],
                   capture_output=True, text=True, timeout=300, check=True)
  except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
    return None
  return cached()


def release_tree(project: str, version: str, kind: str) -> str | None:
  """The files of ``project``'s release ``version``, extracted once beside its archive:
  the sdist's whole tree (its root is the repository's), or the wheel's files less its
  ``.dist-info``/``.data``; None where pip cannot get it."""
  into = os.path.join(SDISTS, "trees", f"{project}-{version}-{kind}")
  if os.path.isdir(into):
    return into
  archive = download(project, version, kind)
  if archive is None:
    return None
  os.makedirs(os.path.dirname(into), exist_ok=True)
  # Extracted aside and renamed into place, so an interrupted run leaves no partial tree.
  partial = tempfile.mkdtemp(dir=os.path.dirname(into))
  if kind == "wheel":
    with zipfile.ZipFile(archive) as wheel:
      wheel.extractall(partial, [n for n in wheel.namelist() if not n.split("/")[0].endswith(
          (".dist-info", ".data"))])
    os.replace(partial, into)
  else:
    with tarfile.open(archive) as sdist:
      sdist.extractall(partial, filter="data")
    (top,) = os.listdir(partial)  # an sdist holds one directory, NAME-VERSION
    os.replace(os.path.join(partial, top), into)
    os.rmdir(partial)
  return into


def repository_config(project: str, version: str) -> list[tuple[str, str]]:
  """(path, name) of the configuration files at the root of ``project``'s repository at
  ``version``, from its sdist (downloaded once into SDISTS); none where pip cannot get it."""
  into = os.path.join(SDISTS, f"{project}-{version}")
  if not os.path.isdir(into):
    sdist = download(project, version, "sdist")
    if sdist is None:
      return []
    with tarfile.open(sdist) as archive:
      os.makedirs(into)
      for member in archive.getmembers():
        parts = member.name.split("/")
        if (member.isfile() and len(parts) == 2 and parts[1] in CONFIG_FILES
            and (f := archive.extractfile(member)) is not None):
          with f, open(os.path.join(into, parts[1]), "wb") as out:
            shutil.copyfileobj(f, out)
  return [(os.path.join(into, name), name) for name in sorted(os.listdir(into))]


def _same_tree(a: str, b: str) -> bool:
  cmp = filecmp.dircmp(a, b, ignore=["__pycache__"])
  if cmp.left_only or cmp.right_only or cmp.diff_files or cmp.funny_files:
    return False
  return all(_same_tree(os.path.join(a, d), os.path.join(b, d)) for d in cmp.common_dirs)


def materialize(repo: Repo, root: str) -> None:
  os.makedirs(os.path.join(root, ".git"))
  for source, target in repo.parts:
    dest = os.path.join(root, target)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    if os.path.isdir(source):
      shutil.copytree(source, dest, ignore=IGNORE)
    else:
      shutil.copy(source, dest)


def codemod(*args: str) -> subprocess.CompletedProcess[str]:
  return subprocess.run([sys.executable, "-m", "codemod.pmap_to_shmap", *args], cwd=ROOT,
                        capture_output=True, text=True, check=False)


def ruff(root: str, select: str, isolated: bool = False) -> list[dict[str, Any]]:
  """ruff's findings under ``root``: with the tree's own configuration, or (``isolated``)
  with ruff's defaults (``root`` is the project root: its packages are first party)."""
  out = subprocess.run([RUFF, "check", *(["--isolated"] if isolated else []), "--select",
                        select, "--output-format", "json", "--no-cache", "--exit-zero", "."],
                       cwd=root, capture_output=True, text=True, check=False)
  found: list[dict[str, Any]] = json.loads(out.stdout or "[]")
  for f in found:
    f["filename"] = os.path.relpath(f["filename"], root)
  return found


def new_findings(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[str]:
  """One ``file:line code message`` per finding by which a (file, code) count grew."""
  def key(f: dict[str, Any]) -> tuple[str, str]:
    return f["filename"], f["code"] or "syntax"

  grown = collections.Counter(map(key, after)) - collections.Counter(map(key, before))
  fresh = (collections.Counter((*key(f), f["message"]) for f in after)
           - collections.Counter((*key(f), f["message"]) for f in before))
  shown = []
  for f in after:
    k, m = key(f), (*key(f), f["message"])
    if grown[k] > 0 and fresh[m] > 0:
      grown[k] -= 1
      fresh[m] -= 1
      shown.append(f"{k[0]}:{f['location']['row']} {k[1]} {f['message']}")
  return shown + [f"{k[0]} {k[1]} (count grew)" for k, n in grown.items() for _ in range(n)]


def import_sorter(root: str) -> str | None:
  """The tool the repository's configuration sorts imports with: "ruff" where ruff's
  rules select I001, else "isort" where isort is configured, else None."""
  isort = False
  for path in glob.glob(os.path.join(root, "**", "*"), recursive=True):
    name = os.path.basename(path)
    isort = isort or name == ".isort.cfg"
    if name in ("pyproject.toml", "ruff.toml", ".ruff.toml"):
      with open(path, "rb") as f:
        config = tomllib.load(f)
      tool = config.get("tool", config) if name == "pyproject.toml" else {"ruff": config}
      isort = isort or "isort" in tool
      lint = tool.get("ruff", {})
      rules = [*lint.get("select", []), *lint.get("extend-select", []),
               *lint.get("lint", {}).get("select", []),
               *lint.get("lint", {}).get("extend-select", [])]
      if any(r == "ALL" or "I001".startswith(r) for r in rules):
        return "ruff"
    if name in ("setup.cfg", "tox.ini"):
      parser = configparser.ConfigParser(interpolation=None)
      parser.read(path)
      isort = isort or parser.has_section("isort") or parser.has_section("tool:isort")
  return "isort" if isort else None


def isort_unsorted(root: str) -> list[dict[str, Any]]:
  """The files isort, run with the repository's configuration, finds unsorted, as I001
  findings (one per file, no line)."""
  out = subprocess.run([ISORT, "--check-only", "--quiet", "--settings-path", root, "."],
                       cwd=root, capture_output=True, text=True, check=False)
  found = re.findall(r"ERROR: (.+?) Imports are incorrectly sorted", out.stdout + out.stderr)
  return [{"filename": os.path.relpath(path, root), "code": "I001", "message":
           "isort: imports are incorrectly sorted", "location": {"row": 0}}
          for path in found]


def sorted_check(root: str, sorter: str) -> list[dict[str, Any]]:
  return ruff(root, "I001") if sorter == "ruff" else isort_unsorted(root)


def comments(text: str) -> collections.Counter[str]:
  try:
    return collections.Counter(t.string.rstrip() for t in
                               tokenize.generate_tokens(io.StringIO(text).readline)
                               if t.type == tokenize.COMMENT)
  except (tokenize.TokenError, SyntaxError):
    return collections.Counter()


def notebook_cells(text: str) -> list[str]:
  cells = json.loads(text).get("cells", [])
  return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
          for c in cells if c.get("cell_type") == "code"]


def code_comments(path: str, text: str) -> collections.Counter[str]:
  if not path.endswith(".ipynb"):
    return comments(text)
  total: collections.Counter[str] = collections.Counter()
  for cell in notebook_cells(text):
    total += comments(cell)
  return total


def added_lines(old: str, new: str) -> list[tuple[int, str]]:
  matcher = difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(), autojunk=False)
  lines = new.splitlines()
  return [(j + 1, lines[j]) for tag, _, _, j1, j2 in matcher.get_opcodes()
          if tag in ("replace", "insert") for j in range(j1, j2)]


def read(path: str) -> str:
  with open(path, encoding="utf-8", errors="surrogateescape") as f:
    return f.read()


def measure(repo: Repo, workdir: str) -> Row:
  row = Row(repo.name)
  ex = row.examples
  base = os.path.join(workdir, re.sub(r"[^\w.]+", "_", repo.name))
  orig, conv = os.path.join(base, "orig"), os.path.join(base, "conv")
  materialize(repo, orig)
  materialize(repo, conv)
  sorter = import_sorter(orig)
  f_before = ruff(orig, "F")
  i_before = sorted_check(orig, sorter) if sorter else []
  i_defaults_before = ruff(orig, "I001", isolated=True)

  report_path = os.path.join(base, "report.txt")
  first = codemod(conv, "--in-place", "--report", report_path)
  report = read(report_path) if os.path.exists(report_path) else ""
  lines = report.splitlines() + first.stderr.splitlines()
  crashes = [line for line in lines if "internal error" in line]
  row.crashes = len(crashes) or int(first.returncode == 2)
  ex["crashes"] += crashes or ([first.stderr.strip()[-300:]] if first.returncode == 2 else [])
  parse = [line for line in lines if "cannot parse" in line or "cannot decode" in line]
  row.parse_failures = len(parse)
  ex["parse_failures"] += parse
  totals = next((m for line in reversed(lines) if (m := TOTALS_RE.search(line))), None)
  if totals:
    row.files, _, row.found, row.converted, row.reported = map(int, totals.groups())
  rows = [line for line in lines if ROW_RE.search(line)]
  row.row_rewrites = len(rows)
  ex["row_rewrites"] += rows

  check = codemod(conv, "--check", "--report", os.path.join(base, "report2.txt"))
  if check.returncode != 0:
    again = codemod(conv, "--diff", "--report", os.path.join(base, "report3.txt"))
    changed = sorted({line[4:].split("\t")[0] for line in again.stdout.splitlines()
                      if line.startswith("+++ ")})
    row.non_idempotent = len(changed) or 1
    ex["non_idempotent"] += changed or [f"--check exit {check.returncode}: "
                                        f"{check.stderr.strip()[-300:]}"]

  new_support: list[tuple[str, str, str, repo_formatter.Formatter]] = []
  formatted_before = False  # the formatter left a changed file's original unchanged
  for dirpath, _, names in os.walk(conv):
    for name in sorted(names):
      path = os.path.join(dirpath, name)
      rel = os.path.relpath(path, conv)
      before_path = os.path.join(orig, rel)
      if not name.endswith((".py", ".ipynb")) or rel.startswith(".git"):
        continue
      new = read(path)
      formatter = repo_formatter.configured(path) if name.endswith(".py") else None
      if formatter is not None:
        row.format_lost = row.format_lost or 0
      if not os.path.exists(before_path):
        if name in SUPPORT_FILES:
          row.support_lines += len(new.splitlines())
          row.support_copies += 1
          if formatter is not None:
            new_support.append((path, rel, new, formatter))
          limit = file_style.configured_width(path) or file_style.DEFAULT_WIDTH
          for number, text in enumerate(new.splitlines(), 1):
            if len(text) > limit:
              row.long_added += 1
              ex["long_added"].append(f"{rel}:{number} ({len(text)} > {limit}) {text.strip()}")
        continue
      old = read(before_path)
      if old == new:
        continue
      lost = code_comments(rel, old) - code_comments(rel, new)
      row.lost_comments += sum(lost.values())
      ex["lost_comments"] += [f"{rel}: {c!r}" for c in lost]
      if name.endswith(".ipynb"):
        support = [c for c in notebook_cells(new) if c.lstrip("\ufeff").startswith(
            NOTEBOOK_SUPPORT)]
        row.notebook_support_lines += sum(len(c.splitlines()) for c in support)
        if support:
          ex["notebook_support_lines"].append(f"{rel}: {len(support[0].splitlines())} lines")
        continue
      if formatter is not None and formatter.format(old, before_path) == old:
        formatted_before = True
        if formatter.format(new, path) != new:
          row.format_lost = (row.format_lost or 0) + 1
          ex["format_lost"].append(f"{rel} ({formatter.name})")
      limit = file_style.detect(old, before_path).width
      for number, text in added_lines(old, new):
        if len(text) > limit:
          row.long_added += 1
          ex["long_added"].append(f"{rel}:{number} ({len(text)} > {limit}) {text.strip()}")

  # A new support module is checked where the repository formats with that formatter.
  for path, rel, new, formatter in new_support if formatted_before else []:
    if formatter.format(new, path) != new:
      row.format_lost = (row.format_lost or 0) + 1
      ex["format_lost"].append(f"{rel} (new, {formatter.name})")
  new_f = new_findings(f_before, ruff(conv, "F"))
  row.new_f = len(new_f)
  ex["new_f"] += new_f
  if sorter:
    new_i = new_findings(i_before, sorted_check(conv, sorter))
    row.new_i001 = len(new_i)
    ex["new_i001"] += new_i
  new_i = new_findings(i_defaults_before, ruff(conv, "I001", isolated=True))
  row.new_i001_defaults = len(new_i)
  ex["new_i001_defaults"] += new_i
  return row


COLUMNS = [("repository", "name"), ("files", "files"), ("sites", "found"),
           ("converted", "converted"), ("reported", "reported"), ("share", "share"),
           ("crashes", "crashes"), ("parse fail", "parse_failures"),
           ("non-idempotent", "non_idempotent"), ("lost comments", "lost_comments"),
           ("new F", "new_f"), ("new I001", "new_i001"),
           ("new I001 (ruff defaults)", "new_i001_defaults"), ("long added lines", "long_added"),
           ("formatter check lost", "format_lost"),
           ("support lines (copies)", "support_lines"),
           ("notebook support lines", "notebook_support_lines"),
           ("row rewrites (review)", "row_rewrites")]


def total(rows: list[Row]) -> Row:
  result = Row("**total**")
  for name in Row.__dataclass_fields__:
    values = [getattr(r, name) for r in rows]
    if name in ("new_i001", "format_lost"):
      known = [v for v in values if v is not None]
      setattr(result, name, sum(known) if known else None)
    elif name not in ("name", "examples"):
      setattr(result, name, sum(values))
  return result


def cell(row: Row, attribute: str) -> str:
  value = getattr(row, attribute)
  if attribute == "share":
    return f"{100 * value:.1f}%"
  if attribute == "support_lines":
    return f"{value} ({row.support_copies})"
  return "n/a" if value is None else str(value)


def table(rows: list[Row]) -> str:
  lines = ["| " + " | ".join(title for title, _ in COLUMNS) + " |",
           "|" + "---|" * len(COLUMNS)]
  lines += ["| " + " | ".join(cell(r, a) for _, a in COLUMNS) + " |"
            for r in [*rows, total(rows)]]
  return "\n".join(lines)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--json", metavar="FILE", help="write the rows and findings here")
  parser.add_argument("--workdir", help="keep the copies here (default: a temp dir, removed)")
  parser.add_argument("--only", nargs="*", default=[], metavar="NAME",
                      help="measure only repositories whose name contains one of these")
  args = parser.parse_args()
  workdir = args.workdir or tempfile.mkdtemp(prefix="codemod_corpus_")
  os.makedirs(workdir, exist_ok=True)
  try:
    rows = []
    for repo in corpus():
      if args.only and not any(o in repo.name for o in args.only):
        continue
      fetch(repo)
      print(f"measuring {repo.name} ...", file=sys.stderr, flush=True)
      rows.append(Row(repo.name) if repo.release and not repo.parts else
                  measure(repo, workdir))
  finally:
    if not args.workdir:
      shutil.rmtree(workdir, ignore_errors=True)
  print(table(rows))
  for r in rows:
    shown = {k: v for k, v in r.examples.items() if v and k != "row_rewrites"}
    for metric, examples in shown.items():
      print(f"\n{r.name} / {metric}:")
      print("\n".join(f"  {e}" for e in examples[:2]))
  if args.json:
    data = [{**{k: getattr(r, k) for k in Row.__dataclass_fields__}, "share": r.share,
             "examples": dict(r.examples)} for r in [*rows, total(rows)]]
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(data, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
