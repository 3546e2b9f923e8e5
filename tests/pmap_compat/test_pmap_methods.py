"""A pmapped function stored on a class is a method, as legacy's: ``obj.f(x)`` passes
``obj`` first, so ``static_broadcasted_argnums=(0,)`` makes ``self`` static."""
import functools

import numpy as np
import pytest

from legacy_messages import same_message
from pmap_compat import pmap
from support.compare import compare_with_legacy


def arr(*shape):
  return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + 1


def _model_class(pm):
  class Model:
    def __init__(self, scale):
      self.scale = scale

    @functools.partial(pm, static_broadcasted_argnums=(0,))
    def apply(self, x):
      return x * self.scale

    unbound = pm(lambda self, x: x + 1)

  return Model


PROGRAMS = {
    "static_self": lambda pm: _model_class(pm)(3.0).apply(arr(8, 2)),
    # Two instances: two static values, two traces (hashed by identity, as legacy).
    "two_instances": lambda pm: (lambda M: (M(2.0).apply(arr(8)), M(5.0).apply(arr(8))))(
        _model_class(pm)),
    "through_the_class": lambda pm: (lambda M: M.apply(M(4.0), arr(8, 2)))(_model_class(pm)),
    "class_attribute_unbound": lambda pm: (
        lambda M: M.apply is vars(M)["apply"])(_model_class(pm)),
    "bound_method_equality": lambda pm: (
        lambda m: (m.apply == m.apply, m.apply.__self__ is m))(_model_class(pm)(1.0)),
    # self as a mapped argument: legacy's rank error.
    "self_mapped": lambda pm: _model_class(pm)(1.0).unbound(arr(8)),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_pmapped_method_binds_like_legacy(name):
  compare_with_legacy(PROGRAMS[name], pmap)


def test_pmapped_method_mapped_self_message_matches_legacy():
  same_message(PROGRAMS["self_mapped"])
