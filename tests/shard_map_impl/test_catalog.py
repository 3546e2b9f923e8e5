"""Differential catalog: every program through JAX's shard_map (reference.py) and
shard_map_impl.shard_map, eagerly and under jit, both partitioners, both
settings of jax_varying_axes_in_types; outputs must match bit for bit (or both
raise the same exception type).

The default run covers every program once (under jit, on one of its meshes,
rotating) plus rotating subsets for eager execution, Shardy and vma-off; the
full cross product is marked slow.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
sys.path.insert(0, os.path.dirname(__file__))

import pytest

from support.jax_lines import requires
from support.meshes import make_mesh
from catalog import CASES
from differential import compare_case

CONFIGS = [(False, True), (False, False), (True, True), (True, False)]  # (shardy, vma)


def _label(shardy, vma):
  return f"{'shardy' if shardy else 'gspmd'}-{'vma' if vma else 'novma'}"


def _all_params():
  for i, c in enumerate(CASES):
    for shape in c.meshes:
      for mode in ("jit", "eager"):
        if (mode == "eager" and not c.eager) or (mode == "jit" and not c.jit):
          continue
        for shardy, vma in CONFIGS:
          if (c.needs_vma or (mode == "eager" and c.eager_needs_vma)) and not vma:
            continue
          if mode == "eager" and shardy:
            continue  # eager execution lowers per primitive; one partitioner suffices
          yield i, c, shape, mode, shardy, vma


def _is_default(i, c, shape, mode, shardy, vma) -> bool:
  """One representative run per program, plus rotating subsets of the rest."""
  rotating_mesh = c.meshes[i % len(c.meshes)]
  if shape != rotating_mesh:
    return False
  if mode == "jit" and not c.jit:
    return False
  key = (mode, shardy, vma)
  share = {("jit", False, True): (1, 0),     # every program
           ("eager", False, True): (2, 0),   # every 2nd, and so on
           ("eager", False, False): (4, 1),
           ("jit", False, False): (3, 1),
           ("jit", True, True): (3, 2),
           ("jit", True, False): (3, 0)}
  if key not in share:
    return False
  every, offset = share[key]
  return i % every == offset


def _params():
  for i, c, shape, mode, shardy, vma in _all_params():
    marks = () if _is_default(i, c, shape, mode, shardy, vma) else (pytest.mark.slow,)
    ident = f"{c.name}-{'x'.join(map(str, shape))}-{mode}-{_label(shardy, vma)}"
    if not vma:
      marks += (requires("vma_switch"),)
    yield pytest.param(c, shape, mode, shardy, vma, id=ident, marks=marks)


def test_catalog_size():
  assert len(CASES) >= 80


@pytest.mark.parametrize("case,shape,mode,shardy,vma", list(_params()))
def test_program_matches_jax(case, shape, mode, shardy, vma):
  compare_case(case, make_mesh(shape), mode, shardy=shardy, vma=vma)
