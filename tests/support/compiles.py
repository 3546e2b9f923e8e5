"""Counting XLA compilations per function name, from JAX's own compile log records."""
from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Iterator

import jax

_FINISHED = "Finished XLA compilation of "


class _Records(logging.Handler):
  def __init__(self, counts: collections.Counter):
    super().__init__(logging.DEBUG)
    self.counts = counts

  def emit(self, record: logging.LogRecord) -> None:
    message = record.getMessage()
    if message.startswith(_FINISHED):
      self.counts[message[len(_FINISHED):].split(" in ")[0]] += 1


@contextlib.contextmanager
def compiles() -> Iterator[collections.Counter]:
  """While inside, the returned Counter maps each compiled program's name as JAX logs it
  (``jit(train_step)``, ``pmap_train_step``) to the number of backend compilations."""
  counts: collections.Counter = collections.Counter()
  handler = _Records(counts)
  logger = logging.getLogger("jax._src.dispatch")
  logger.addHandler(handler)
  try:
    with jax.log_compiles(True):
      yield counts
  finally:
    logger.removeHandler(handler)


def step_compiles(counts: collections.Counter, name: str) -> int:
  """Compilations of the program made from the function ``name`` (legacy pmap names it
  ``pmap_<name>``, jit ``jit(<name>)``, a bare name where the logger gives one)."""
  return sum(n for program, n in counts.items()
             if program in (name, f"pmap_{name}", f"jit({name})", f"jit_{name}"))
