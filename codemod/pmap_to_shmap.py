"""Command line: rewrite ``jax.pmap`` call sites under PATH... into ``jax.jit(shard_map(...))``."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="pmap-to-shmap",
      description="Rewrite jax.pmap call sites into jax.jit(shard_map(...)) with equivalent specs.")
  p.add_argument("paths", nargs="+", metavar="PATH", help=".py files, notebooks or directories")
  mode = p.add_mutually_exclusive_group()
  mode.add_argument("--diff", action="store_true", help="print a unified diff (default)")
  mode.add_argument("--check", action="store_true", help="exit 1 if anything would change")
  mode.add_argument("--in-place", action="store_true", help="rewrite files in place")
  p.add_argument("--report", metavar="FILE", help="write the site report to FILE")
  p.add_argument("--jobs", type=int, default=1, metavar="N", help="worker processes")
  p.add_argument("--target", choices=("experimental", "jax"), help="which shard_map API to emit")
  p.add_argument("--strategy", choices=("shard_map", "shim"), default="shard_map")
  p.add_argument("--multihost", action="store_true",
                 help="emit host-local <-> global conversions for multi-process code")
  return p


def main(argv: Sequence[str] | None = None) -> int:
  build_parser().parse_args(argv)
  raise NotImplementedError("the pmap_to_shmap rewrite is provided by the codemod work (issue 7)")


if __name__ == "__main__":
  sys.exit(main())
