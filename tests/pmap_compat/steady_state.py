"""``warm_calls``: which of pmap_compat's Python functions run in steady-state calls."""
from __future__ import annotations

import os
import sys
from typing import Any
from collections.abc import Callable

import pmap_compat

_PACKAGE = os.path.dirname(os.path.abspath(pmap_compat.__file__)) + os.sep


def warm_calls(f: Callable[[Any], Any], x: Any, times: int = 3) -> tuple[Any, list[str]]:
  """Warms ``f`` (``x = f(x)``, then ``f(x)`` once more so the C++ cache serves that
  signature), then makes ``times`` calls, feeding each result to the next one. Returns the
  last result (``times + 1`` applications of ``f``) and the names of pmap_compat's Python
  functions entered during the ``times`` calls."""
  x = f(x)
  f(x)
  ours: list[str] = []

  def profile(frame, event, _):
    if event == "call" and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
      ours.append(frame.f_code.co_name)
  sys.setprofile(profile)
  try:
    for _ in range(times):
      x = f(x)
  finally:
    sys.setprofile(None)
  return x, ours
