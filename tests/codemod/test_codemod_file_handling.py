"""What the command line does with awkward files: unwritable files and directories,
undecodable text, symlinks, and the temporary files an interrupted run leaves behind.

Each case runs the real ``python -m codemod.pmap_to_shmap`` on real files. A bad file is
an ERROR for that file and the rest of the run goes on; exit 3 (a path could not be read,
listed or written) stays distinct from 1 (changes pending under --check) and 2 (internal
error). No file is ever half-written or replaced by something else.
"""
import os
import shutil
import signal
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
TEMP_GLOB = ".pmap-to-shmap-*"


def _env() -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("PYTHONPATH", None)
  return env


def _unprivileged() -> list[str]:
  """A command prefix under which file permissions hold: root passes them by its
  capabilities, so as root they are dropped from the child's bounding set."""
  if os.geteuid() != 0:
    return []
  setpriv = shutil.which("setpriv")
  if setpriv is None:
    pytest.skip("running as root without setpriv: file permissions cannot be enforced")
  return [setpriv, "--bounding-set", "-dac_override,-dac_read_search,-fowner"]


def _cli(*args, prefix=(), timeout=120) -> subprocess.CompletedProcess:
  return subprocess.run([*prefix, sys.executable, "-m", "codemod.pmap_to_shmap",
                         *map(str, args)], capture_output=True, text=True, cwd=ROOT,
                        env=_env(), timeout=timeout, check=False)


def _converted(tmp_path, text: str = SITE) -> str:
  """What a run on a lone writable copy of ``text`` writes: the reference output."""
  reference = tmp_path / "reference"
  reference.mkdir()
  (reference / "site.py").write_text(text)
  r = _cli("--in-place", reference)
  assert r.returncode == 0, r.stderr
  return (reference / "site.py").read_text()


def _temp_files(*directories) -> list:
  return [p for d in directories for p in d.glob(TEMP_GLOB)]


@pytest.fixture
def locked():
  """chmod's a path for the test and gives it its mode back (so tmp_path can be removed)."""
  restore = []

  def lock(path, mode):
    restore.append((path, os.stat(path).st_mode))
    os.chmod(path, mode)
  yield lock
  for path, mode in reversed(restore):
    os.chmod(path, mode)


def _three_packages(tmp_path):
  tree = tmp_path / "tree"
  for name in ("a_first", "b_middle", "c_last"):
    (tree / name).mkdir(parents=True)
    (tree / name / "site.py").write_text(SITE)
  return tree


# ----- unwritable files and directories -----

def test_read_only_directory_is_an_error_for_its_files_and_the_run_goes_on(tmp_path, locked):
  expected = _converted(tmp_path)
  tree = _three_packages(tmp_path)
  locked(tree / "b_middle", 0o555)
  report = tmp_path / "report.txt"
  r = _cli("--in-place", "--report", report, tree, prefix=_unprivileged())
  assert r.returncode == 3, r.stderr
  assert r.returncode == pmap_to_shmap.EXIT_UNREADABLE_OR_UNWRITABLE
  assert "Traceback" not in r.stderr
  assert (tree / "a_first" / "site.py").read_text() == expected
  assert (tree / "c_last" / "site.py").read_text() == expected
  assert (tree / "b_middle" / "site.py").read_text() == SITE
  lines = report.read_text().splitlines()
  # A script's support module goes next to it: the locked directory cannot take it, so
  # its file is left unchanged (it would import a module that is not there).
  locked_file = str(tree / "b_middle" / "site.py")
  assert (f"{locked_file}:1:1 ERROR cannot write the support module it imports; the file is "
          "left unchanged, 1 sites not converted") in lines, lines
  assert (f"{tree / 'b_middle' / 'pmap_shard_map.py'}:1:1 ERROR cannot write the support "
          "module pmap_shard_map: Permission denied") in lines, lines
  # The site it left alone is not reported converted.
  assert not any(l.startswith(locked_file) and " INFO " in l for l in lines), lines
  assert lines[-1] == ("3 files scanned, 2 changed; 3 pmap sites found, 2 converted, "
                       "1 reported; 2 errors, 0 warnings; 2 paths could not be read or written")
  for written in ("a_first", "c_last"):
    assert (tree / written / "pmap_shard_map.py").read_text() == support_module.source(
        {"per_device", "placed_on", BEFORE_0_7_2, KEYWORDS})
  assert not _temp_files(tree, *tree.iterdir())
  # --check writes nothing, so the same tree is "changes pending", not a failure.
  assert _cli("--check", tree, prefix=_unprivileged()).returncode == 1


def test_read_only_file_is_not_replaced(tmp_path, locked):
  expected = _converted(tmp_path)
  tree = _three_packages(tmp_path)
  locked(tree / "b_middle" / "site.py", 0o444)
  r = _cli("--in-place", tree, prefix=_unprivileged())
  assert r.returncode == 3, r.stderr
  assert "b_middle/site.py:1:1 ERROR cannot write the file: read-only file; the file is left" in r.stderr
  assert (tree / "b_middle" / "site.py").read_text() == SITE
  assert os.stat(tree / "b_middle" / "site.py").st_mode & 0o777 == 0o444
  assert (tree / "c_last" / "site.py").read_text() == expected


def test_unreadable_file_and_unlistable_directory_are_errors(tmp_path, locked):
  expected = _converted(tmp_path)
  tree = _three_packages(tmp_path)
  (tree / "d_closed").mkdir()
  (tree / "d_closed" / "site.py").write_text(SITE)
  locked(tree / "b_middle" / "site.py", 0o000)
  locked(tree / "d_closed", 0o000)
  r = _cli("--in-place", tree, prefix=_unprivileged())
  assert r.returncode == 3, r.stderr
  assert "b_middle/site.py:1:1 ERROR cannot read the file, skipped: Permission denied" in r.stderr
  assert "d_closed:1:1 ERROR cannot list the directory, skipped: Permission denied" in r.stderr
  assert (tree / "c_last" / "site.py").read_text() == expected
  assert "; 2 paths could not be read or written" in r.stderr


def test_unwritable_support_module_leaves_the_files_that_import_it_unchanged(tmp_path, locked):
  tree = _three_packages(tmp_path)
  locked(tree, 0o555)  # the support root; the packages under it stay writable
  # One module, at the root, for every file.
  r = _cli("--in-place", "--support-module", "pmap_shard_map", tree, prefix=_unprivileged())
  assert r.returncode == 3, r.stderr
  assert "pmap_shard_map.py:1:1 ERROR cannot write the support module pmap_shard_map" in r.stderr
  assert "cannot write the support module it imports; the file is left unchanged" in r.stderr
  assert all((tree / d / "site.py").read_text() == SITE for d in ("a_first", "b_middle", "c_last"))
  assert not (tree / "pmap_shard_map.py").exists()


def test_unwritable_report_goes_to_stderr_with_exit_3(tmp_path, locked):
  tree = _three_packages(tmp_path)
  (tmp_path / "out").mkdir()
  locked(tmp_path / "out", 0o555)
  r = _cli("--check", "--report", tmp_path / "out" / "report.txt", tree, prefix=_unprivileged())
  assert r.returncode == 3
  assert "cannot write the report" in r.stderr and "3 pmap sites found" in r.stderr


def test_a_crash_outside_the_files_exits_2_not_1(tmp_path, capsys, monkeypatch):
  from codemod import files

  def broken(paths, follow_symlinks=False):
    raise RuntimeError("boom")
  monkeypatch.setattr(files, "discover", broken)
  (tmp_path / "site.py").write_text(SITE)
  assert pmap_to_shmap.main(["--check", str(tmp_path)]) == 2
  assert "RuntimeError: boom" in capsys.readouterr().err


# ----- encodings -----

def test_undecodable_file_is_an_error_and_a_declared_encoding_round_trips(tmp_path):
  tree = tmp_path / "tree"
  tree.mkdir()
  latin = '# caf\xe9\nimport jax\n\n\ndef f(x):\n    return x\n\n\ng = jax.pmap(f, axis_name="i")\n'
  (tree / "a_no_cookie.py").write_bytes(latin.encode("latin-1"))
  (tree / "b_unknown_cookie.py").write_bytes(b"# -*- coding: no-such-codec -*-\n" + SITE.encode())
  declared = "# -*- coding: latin-1 -*-\n" + latin
  (tree / "c_cookie.py").write_bytes(declared.encode("latin-1"))
  (tree / "d_page.md").write_bytes("```{code-cell} ipython3\n# caf\xe9\ng = jax.pmap(f)\n```\n"
                                    .encode("latin-1"))
  (tree / "e_notes.md").write_bytes("Plain notes, caf\xe9.\n".encode("latin-1"))
  (tree / "f_site.py").write_text(SITE)
  r = _cli("--in-place", tree)
  assert r.returncode == 0, r.stderr  # a file's content, like a syntax error: not exit 2
  assert "a_no_cookie.py:1:1 ERROR cannot decode the file, skipped" in r.stderr
  assert "b_unknown_cookie.py:1:1 ERROR cannot decode the file, skipped" in r.stderr
  assert "d_page.md:1:1 ERROR cannot decode the file, skipped" in r.stderr
  assert "internal error" not in r.stderr
  assert (tree / "a_no_cookie.py").read_bytes() == latin.encode("latin-1")
  raw = (tree / "c_cookie.py").read_bytes()
  assert raw.startswith(b"# -*- coding: latin-1 -*-\n# caf\xe9\n") and b"jax.jit(" in raw
  assert "e_notes.md" not in r.stderr  # plain markdown is not the codemod's business
  assert "jax.pmap" not in (tree / "f_site.py").read_text()
  assert "6 files scanned, 2 changed; 2 pmap sites found, 2 converted" in r.stderr


# ----- symlinks -----

def _outside_and_tree(tmp_path):
  outside = tmp_path / "outside"
  outside.mkdir()
  (outside / "real.py").write_text(SITE)
  tree = tmp_path / "tree"
  tree.mkdir()
  (tree / "link.py").symlink_to(outside / "real.py")
  return outside, tree


def test_symlink_out_of_the_paths_is_reported_and_left_alone(tmp_path):
  outside, tree = _outside_and_tree(tmp_path)
  (outside / "pkg").mkdir()
  (outside / "pkg" / "deep.py").write_text(SITE)
  (tree / "linked_dir").symlink_to(outside / "pkg", target_is_directory=True)
  warning = (f"link.py:1:1 WARNING symlink to {os.path.realpath(outside / 'real.py')}, outside "
             "the given paths: left alone (--follow-symlinks converts the file it points to)")
  r = _cli("--in-place", tree)
  assert r.returncode == 0, r.stderr
  assert warning in r.stderr
  assert (f"linked_dir:1:1 WARNING symlink to the directory {os.path.realpath(outside / 'pkg')}, "
          "outside the given paths: not walked (--follow-symlinks walks it)") in r.stderr
  r = _cli("--in-place", tree / "link.py")  # named directly: the same rule
  assert r.returncode == 0, r.stderr
  assert warning in r.stderr
  assert os.path.islink(tree / "link.py") and os.path.islink(tree / "linked_dir")
  assert (outside / "real.py").read_text() == SITE
  assert (outside / "pkg" / "deep.py").read_text() == SITE


def test_follow_symlinks_writes_the_target_and_keeps_the_link(tmp_path):
  expected = _converted(tmp_path)
  outside, tree = _outside_and_tree(tmp_path)
  (outside / "pkg").mkdir()
  (outside / "pkg" / "deep.py").write_text(SITE)
  (outside / "pkg" / "loop").symlink_to(outside, target_is_directory=True)  # a cycle
  (tree / "linked_dir").symlink_to(outside / "pkg", target_is_directory=True)
  r = _cli("--in-place", "--follow-symlinks", tree, timeout=60)
  assert r.returncode == 0, r.stderr
  assert os.path.islink(tree / "link.py") and os.path.islink(tree / "linked_dir")
  assert (outside / "real.py").read_text() == expected
  assert (outside / "pkg" / "deep.py").read_text() == expected
  assert "2 files scanned, 2 changed; 2 pmap sites found, 2 converted" in r.stderr
  assert not _temp_files(outside, outside / "pkg", tree)


def test_a_file_reached_through_links_inside_the_tree_is_converted_once(tmp_path):
  expected = _converted(tmp_path)
  tree = tmp_path / "tree"
  (tree / "pkg").mkdir(parents=True)
  (tree / "pkg" / "site.py").write_text(SITE)
  (tree / "alias.py").symlink_to(tree / "pkg" / "site.py")
  (tree / "again").symlink_to(tree / "pkg", target_is_directory=True)
  r = _cli("--in-place", tree, tree / "alias.py")
  assert r.returncode == 0, r.stderr
  assert "1 files scanned, 1 changed; 1 pmap sites found, 1 converted" in r.stderr
  assert (tree / "pkg" / "site.py").read_text() == expected
  assert os.path.islink(tree / "alias.py") and os.path.islink(tree / "again")
  assert f"{tree / 'pkg' / 'site.py'}:8:5 INFO pmap converted" in r.stderr


def test_broken_symlink_and_fifo_are_reported_not_read(tmp_path):
  (tmp_path / "gone.py").symlink_to(tmp_path / "missing.py")
  os.mkfifo(tmp_path / "pipe.py")  # opening it would block the run
  (tmp_path / "site.py").write_text(SITE)
  r = _cli("--check", tmp_path, timeout=60)
  assert r.returncode == 1, r.stderr
  assert "gone.py:1:1 WARNING broken symlink" in r.stderr
  assert "pipe.py:1:1 WARNING not a regular file, skipped" in r.stderr
  assert "1 files scanned, 1 changed" in r.stderr


# ----- temporary files of an interrupted run -----

# Runs the CLI with os.replace blocked after the first temp file (the support module's,
# written before the files that import it) is fully written and synced, so the SIGKILL
# lands where an interrupted run leaves a full-size temp file.
_BLOCKED_WRITER = """
import os, sys, time
def blocked(src, dst):
  print("temp file written", flush=True)
  time.sleep(120)
os.replace = blocked
from codemod import pmap_to_shmap
sys.exit(pmap_to_shmap.main(sys.argv[1:]))
"""


def test_temp_file_left_by_sigkill_is_removed_by_the_next_run_and_never_read(tmp_path):
  expected = _converted(tmp_path)
  tree = tmp_path / "tree"
  tree.mkdir()
  (tree / "site.py").write_text(SITE)
  child = subprocess.Popen([sys.executable, "-c", _BLOCKED_WRITER, "--in-place", str(tree)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                           env=_env())
  try:
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "temp file written"
    os.kill(child.pid, signal.SIGKILL)
  finally:
    child.kill()
    child.communicate(timeout=60)
  assert child.returncode == -signal.SIGKILL
  (temp,) = _temp_files(tree)
  assert f"-{child.pid}-" in temp.name and temp.name.endswith(".tmp")
  # Full size, as the issue saw: what the site calls.
  assert temp.read_text() == support_module.source({"per_device", "placed_on", BEFORE_0_7_2, KEYWORDS})
  assert (tree / "site.py").read_text() == SITE  # never half-written
  assert not (tree / "pmap_shard_map.py").exists()

  r = _cli("--check", tree)  # a run that writes nothing only reports it
  assert r.returncode == 1 and temp.exists()
  assert (f"{temp}:1:1 INFO temporary file left by an interrupted pmap-to-shmap run "
          f"(pid {child.pid}); --in-place removes it") in r.stderr
  assert "1 files scanned" in r.stderr  # the temp file is not read as a source
  r = _cli("--in-place", tree)
  assert r.returncode == 0, r.stderr
  assert not temp.exists() and not _temp_files(tree)
  assert f"{temp}:1:1 INFO removed the temporary file left by an interrupted" in r.stderr
  assert (tree / "site.py").read_text() == expected
  assert (tree / "pmap_shard_map.py").read_text() == support_module.source(
      {"per_device", "placed_on", BEFORE_0_7_2, KEYWORDS})


def test_temp_files_of_a_live_run_or_an_older_version_are_left_alone(tmp_path):
  (tmp_path / "site.py").write_text(SITE)
  running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    import socket
    host = socket.gethostname()
    live = tmp_path / f".pmap-to-shmap-{host}-{running.pid}-abcd1234.tmp"
    other_host = tmp_path / ".pmap-to-shmap-elsewhere-1-abcd1234.tmp"
    older = tmp_path / ".pmap-to-shmap-abcd1234.tmp"
    for path in (live, other_host, older):
      path.write_text(SITE)
    r = _cli("--in-place", tmp_path)
  finally:
    running.kill()
    running.wait(timeout=30)
  assert r.returncode == 0, r.stderr
  assert live.exists() and other_host.exists() and older.exists()
  assert f"(pid {running.pid}) that may still be running: left alone" in r.stderr
  assert "run on elsewhere (pid 1) that may still be running: left alone" in r.stderr
  assert f"{older}:1:1 WARNING temporary file of an earlier pmap-to-shmap run" in r.stderr
  assert "1 files scanned, 1 changed" in r.stderr
