"""Runs migration_guide.md's Python blocks in one interpreter of any JAX line.

  python tests/guide/run_blocks.py BLOCKS.json RESULTS.json [--distributed COORD PID NPROC]

BLOCKS.json is a list of {"name", "code"}; each block runs in a fresh namespace, in
order, in this process. RESULTS.json maps every name to "ok" or the block's traceback.
With --distributed the process first joins a jax.distributed job over gloo (CPU), so
the blocks run as one process of a multi-process job; each process writes its own
RESULTS file. Run with `-W error::DeprecationWarning`, as JAX's test policy requires.
"""
from __future__ import annotations

import json
import sys
import traceback


def _join_job(coordinator: str, process_id: int, num_processes: int) -> None:
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)


def run(blocks: list[dict[str, str]]) -> dict[str, str]:
  results = {}
  for block in blocks:
    try:
      exec(compile(block["code"], f"migration_guide.md:{block['name']}", "exec"),  # pylint: disable=exec-used
           {"__name__": "__guide__"})
      results[block["name"]] = "ok"
    except BaseException:  # pylint: disable=broad-except
      results[block["name"]] = traceback.format_exc()
  return results


def main(argv: list[str]) -> None:
  blocks_path, results_path, *rest = argv
  distributed = rest[:1] == ["--distributed"]
  if distributed:
    _join_job(rest[1], int(rest[2]), int(rest[3]))
  with open(blocks_path, encoding="utf-8") as f:
    results = run(json.load(f))
  with open(results_path, "w", encoding="utf-8") as f:
    json.dump(results, f)
  if distributed:
    import jax  # pylint: disable=import-outside-toplevel
    # With gloo, processes that still hold arrays can hang at interpreter exit.
    jax.distributed.shutdown()


if __name__ == "__main__":
  main(sys.argv[1:])
