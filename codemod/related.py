"""Report entries for patterns around pmap that the rewrite does not change.

``jax.device_put_replicated`` / ``device_put_sharded`` (removed from newer JAX), the
``x[0]`` / ``unreplicate`` idiom on pmap outputs, ``jax.local_device_count()``-sized
reshapes, and multi-process code (``process_count`` / ``process_index``) run without
``--multihost``. Each entry says what to do; none of them edits the code.
"""
from __future__ import annotations

from typing import Callable

import libcst as cst
from libcst.metadata import PositionProvider, QualifiedNameProvider

from codemod.findings import Finding, Severity

_REPLICATED = frozenset({"jax.device_put_replicated", "jax.api.device_put_replicated"})
_SHARDED = frozenset({"jax.device_put_sharded", "jax.api.device_put_sharded"})
_UNREPLICATE = frozenset({"flax.jax_utils.unreplicate"})
_REPLICATE = frozenset({"flax.jax_utils.replicate"})
_LOCAL_COUNT = frozenset({"jax.local_device_count"})
_PROCESS = frozenset({"jax.process_count", "jax.process_index", "jax.host_count",
                      "jax.host_id"})

_LAST_NAMES = frozenset(name.rsplit(".", 1)[1] for name in (
    _REPLICATED | _SHARDED | _UNREPLICATE | _REPLICATE | _LOCAL_COUNT | _PROCESS))

GUIDANCE = {
    "replicated": (
        Severity.WARNING,
        "jax.device_put_replicated is removed in newer JAX. The converted function "
        "accepts any array, so an exact replacement is "
        "`jax.tree.map(lambda v: jnp.stack([v] * len(devices)), x)`; better, pass x "
        "unreplicated and map it with in_axes=None (spec P())"),
    "sharded": (
        Severity.WARNING,
        "jax.device_put_sharded is removed in newer JAX; the exact replacement is "
        "`jax.tree.map(lambda *s: jnp.stack(s), *shards)` (the converted function "
        "places it on the mesh itself)"),
    "unreplicate": (
        Severity.INFO,
        "unreplicate / x[0] on a pmap output keeps working after the rewrite but "
        "gathers device 0's slice; for values that are the same on every device, "
        "return them with out_axes=None (spec P()) instead"),
    "replicate": (
        Severity.INFO,
        "flax replicate keeps working (the converted function reshards its input); "
        "passing the value unreplicated with in_axes=None (spec P()) is cheaper"),
    "local_count": (
        Severity.INFO,
        "a jax.local_device_count()-sized reshape: still right after the rewrite, "
        "whose mesh spans the first n local devices for a mapped axis of size n"),
    "process": (
        Severity.WARNING,
        "multi-process code (process_count / process_index): rerun the codemod with "
        "--multihost so the converted sites convert host-local arrays to global ones "
        "and back; otherwise each process's shard_map spans only its own devices"),
}


class RelatedPatterns(cst.CSTVisitor):
  """Collects report entries for the related patterns into ``findings``."""

  def __init__(self, get_metadata: Callable, multihost: bool):
    self.get_metadata = get_metadata
    self.multihost = multihost
    self.findings: list[Finding] = []
    self._reshape_depth = 0

  def _names(self, node: cst.CSTNode) -> set[str]:
    return {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}

  def _add(self, node: cst.CSTNode, kind: str) -> None:
    severity, message = GUIDANCE[kind]
    pos = self.get_metadata(PositionProvider, node).start
    self.findings.append(Finding(pos.line, pos.column + 1, severity, message))

  def visit_Call(self, node: cst.Call) -> None:
    if _is_reshape(node):
      self._reshape_depth += 1
    func = node.func
    last = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
    if last not in _LAST_NAMES:
      return  # qualified names are lazy and costly: only resolve plausible callees
    names = self._names(func)
    if names & _REPLICATED:
      self._add(node, "replicated")
    elif names & _SHARDED:
      self._add(node, "sharded")
    elif names & _UNREPLICATE:
      self._add(node, "unreplicate")
    elif names & _REPLICATE:
      self._add(node, "replicate")
    elif names & _PROCESS and not self.multihost:
      self._add(node, "process")
    elif names & _LOCAL_COUNT and self._reshape_depth:
      self._add(node, "local_count")

  def leave_Call(self, original_node: cst.Call) -> None:
    if _is_reshape(original_node):
      self._reshape_depth -= 1

  def visit_Lambda(self, node: cst.Lambda) -> None:
    # `lambda x: x[0]`, the hand-written unreplicate.
    body = node.body
    params = node.params.params
    if (len(params) == 1 and isinstance(body, cst.Subscript) and isinstance(body.value, cst.Name)
        and body.value.value == params[0].name.value and len(body.slice) == 1):
      index = body.slice[0].slice
      if isinstance(index, cst.Index) and isinstance(index.value, cst.Integer) \
          and index.value.value == "0":
        self._add(node, "unreplicate")


def _is_reshape(node: cst.Call) -> bool:
  func = node.func
  return ((isinstance(func, cst.Attribute) and func.attr.value == "reshape")
          or (isinstance(func, cst.Name) and func.value == "reshape"))


def related_findings(module: cst.Module, get_metadata: Callable, multihost: bool) -> list[Finding]:
  """The report entries for ``module``'s pmap-adjacent patterns."""
  visitor = RelatedPatterns(get_metadata, multihost)
  module.visit(visitor)
  return visitor.findings
