"""The pmap body's arguments grouped the way the user's function names them.

shard_map builds the body's DebugInfo with ``api_util.debug_info`` from the body's
signature and the arguments it is given. Handing it the flat leaves would name them
``blocks[0]``, ``blocks[1]``, ... in tracing errors. Instead the leaves go in grouped per
parameter of the user's function (``x``, ``d`` holding its dict, ``rest`` holding the
tuple of extra positional arguments, then each keyword argument), under a signature with
those parameter names, so errors say "argument d['b']" as legacy pmap's do. The grouping
does not change the order of the leaves.
"""
from __future__ import annotations

import collections
import inspect
from typing import Any, NamedTuple
from collections.abc import Callable, Sequence

from jax._src import api_util
from jax.tree_util import tree_flatten, tree_structure, tree_unflatten


class Grouped(NamedTuple):
  signature: inspect.Signature  # one positional-only parameter per group
  tree: Any                     # treedef of the tuple of groups (same leaf order as the call)


_STATIC = object()  # marks a static argument while binding: it is not a leaf


def group(fun: Callable, args: Sequence[Any], kwargs: dict,
          static: Sequence[int]) -> Grouped | None:
  """Groups for a call ``fun(*args, **kwargs)`` (None where names cannot be given: no
  signature, arguments it does not bind, static values among the extra positionals, or
  keyword arguments split between named parameters and ``**kwargs``)."""
  signature = api_util.fun_signature(fun)
  if signature is None:
    return None
  marked = [_STATIC if i in static else a for i, a in enumerate(args)]
  try:
    bound = signature.bind(*marked, **kwargs)
  except TypeError:
    return None
  kinds = {name: p.kind for name, p in signature.parameters.items()}
  names, groups = [], []
  for name, value in bound.arguments.items():
    if name in kwargs or value is _STATIC or kinds[name] is inspect.Parameter.VAR_KEYWORD:
      continue  # keyword arguments follow, in jit's order (sorted by name)
    if kinds[name] is inspect.Parameter.VAR_POSITIONAL and any(v is _STATIC for v in value):
      return None
    names.append(name)
    groups.append(value)
  named = [k for k in sorted(kwargs) if kinds.get(k) in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                          inspect.Parameter.KEYWORD_ONLY)]
  gathered = {k: v for k, v in kwargs.items() if k not in named}
  if gathered and named:
    return None  # the leaf order (sorted keys) would interleave the two groups
  if gathered:  # all of them go to the function's **kwargs: one dict group under its name
    names.append(next(n for n, kind in kinds.items() if kind is inspect.Parameter.VAR_KEYWORD))
    groups.append(gathered)
  for key in named:
    names.append(key)
    groups.append(kwargs[key])
  # The specs are laid out in the same tree: only containers we may build with other
  # leaves keep their structure; a user's pytree class becomes the tuple of its leaves.
  groups = [g if _plain_containers(tree_structure(g)) else tuple(tree_flatten(g)[0])
            for g in groups]
  params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in names]
  return Grouped(inspect.Signature(params), tree_structure(tuple(groups)))


_PLAIN = (tuple, list, dict, collections.OrderedDict, collections.defaultdict, type(None))


def _plain_containers(tree: Any) -> bool:
  node = tree.node_data()
  if node is None:
    return True  # a leaf
  kind = node[0]
  plain = kind in _PLAIN or (issubclass(kind, tuple) and hasattr(kind, "_fields"))
  return plain and all(_plain_containers(c) for c in tree.children())


def regroup(grouped: Grouped, leaves: Sequence[Any]) -> tuple:
  """``leaves`` (in call order) as the tuple of groups."""
  return tree_unflatten(grouped.tree, leaves)


def flatten(groups: tuple) -> list:
  return tree_flatten(groups)[0]
