"""Sphinx configuration of the documentation site (`make docs`; tests/test_docs.py)."""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tested_releases() -> tuple[str, ...]:
  """`shard_map_impl/supported_jax.py`'s TESTED, read without importing JAX."""
  path = os.path.join(ROOT, "shard_map_impl", "supported_jax.py")
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "TESTED" for t in node.targets):
      return tuple(ast.literal_eval(node.value))
  raise RuntimeError(f"no TESTED in {path}")


TESTED = _tested_releases()

project = "pmap-compat"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 4
myst_enable_extensions = ["substitution"]
# The supported releases, from their one source (docs/versions.md uses these).
myst_substitutions = {
    "oldest_jax": TESTED[0],
    "newest_jax": TESTED[-1],
    "tested_jax": ", ".join(TESTED),
}
html_theme = "alabaster"
html_static_path: list[str] = []
