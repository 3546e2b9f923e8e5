#!/usr/bin/env bash
# Lists blocks of the project's Python (tracked and untracked) that repeat JAX's own
# shard_map / multihost_utils / api / pxla / pjit sources. Optional args: paths to limit to.
set -u
top=$(git rev-parse --show-toplevel) && cd "$top" || exit 1
py=.venv/bin/python
jaxdir=$($py -c 'import jax, os; print(os.path.dirname(jax.__file__))')
tmp=$(mktemp -d); mkdir -p "$tmp/project" "$tmp/jax"
git ls-files --cached --others --exclude-standard '*.py' -- "${@:-.}" | while read -r f; do
  [ -f "$f" ] || continue
  mkdir -p "$tmp/project/$(dirname "$f")"; cp "$f" "$tmp/project/$f"; done
for f in experimental/shard_map.py experimental/multihost_utils.py _src/api.py _src/interpreters/pxla.py _src/pjit.py; do
  cp "$jaxdir/$f" "$tmp/jax/$(echo "$f" | tr / _)"; done
duplicates --repo "$tmp" --most 200 --seconds 60 | grep -E '(jax/.* ~ project/|project/.* ~ jax/)' || echo "no blocks repeat JAX's sources"
rm -rf "$tmp"
