"""Patterns around pmap: report entries, and (``--target jax``) names newest JAX removed.

``jax.device_put_replicated`` / ``device_put_sharded`` (removed from newer JAX: rewritten
for ``--target jax``, reported otherwise), the ``jax.tree_map`` family (rewritten for
``--target jax``), other removed modules (reported), the ``x[0]`` / ``unreplicate``
idiom on pmap outputs and ``jax.local_device_count()``-sized reshapes. The removed names
are collected here and rewritten by ``removed_apis``.
"""
from __future__ import annotations

from collections.abc import Callable

import libcst as cst
from libcst.metadata import PositionProvider, QualifiedNameProvider

from codemod import removed_names
from codemod.findings import Finding, Severity

_REPLICATED = frozenset({"jax.device_put_replicated", "jax.api.device_put_replicated"})
_SHARDED = frozenset({"jax.device_put_sharded", "jax.api.device_put_sharded"})
_UNREPLICATE = frozenset({"flax.jax_utils.unreplicate"})
_REPLICATE = frozenset({"flax.jax_utils.replicate"})
_LOCAL_COUNT = frozenset({"jax.local_device_count"})

_LAST_NAMES = frozenset(name.rsplit(".", 1)[1] for name in (
    _REPLICATED | _SHARDED | _UNREPLICATE | _REPLICATE | _LOCAL_COUNT))

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
        "unreplicate / x[0]: where it reads a pmap output, it keeps working after the "
        "rewrite but gathers device 0's slice; for values that are the same on every "
        "device, return them with out_axes=None (spec P()) instead"),
    "replicate": (
        Severity.INFO,
        "flax replicate keeps working (the converted function reshards its input); "
        "passing the value unreplicated with in_axes=None (spec P()) is cheaper"),
    "local_count": (
        Severity.INFO,
        "a jax.local_device_count()-sized reshape: still right after the rewrite, "
        "whose site maps over every device of its mesh (each process passing its "
        "local rows, as under pmap)"),
}


class RelatedPatterns(cst.CSTVisitor):
  """Collects report entries for the related patterns into ``findings``."""

  def __init__(self, get_metadata: Callable, target: str, removed_only: bool = False):
    # The command's metadata lookup: this visitor walks the command's tree, not its own.
    self.get_metadata = get_metadata  # type: ignore[method-assign]
    self.rewrite_removed = target == "jax"
    self.removed_only = removed_only  # the removed names alone: no pmap idioms
    self.findings: list[Finding] = []
    self.renames: list[tuple[cst.CSTNode, str]] = []        # node -> dotted replacement
    self.support_calls: list[tuple[cst.CSTNode, str]] = []  # callee -> support function
    self.removed_imports: list[tuple[str, str, str | None]] = []  # (module, name, alias)
    self.removed_spellings: set[str] = set(removed_names.LAST_NAMES)  # names to resolve
    self._reshape_depth = 0

  def _names(self, node: cst.CSTNode) -> set[str]:
    return {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}

  def _add(self, node: cst.CSTNode, kind: str) -> None:
    self._finding(node, *GUIDANCE[kind])

  def _finding(self, node: cst.CSTNode, severity: Severity, message: str) -> None:
    pos = self.get_metadata(PositionProvider, node).start
    self.findings.append(Finding(pos.line, pos.column + 1, severity, message))

  # ----- names newest JAX removed -----

  def removed_name(self, node: cst.CSTNode) -> bool:
    """Records ``node`` (a Name or Attribute) if it names something newest JAX removed."""
    if not self.rewrite_removed:
      return False
    names = self._names(node)
    for name in names:
      if name in removed_names.TREE_RENAMES:
        self.renames.append((node, removed_names.TREE_RENAMES[name]))
        return True
      if name in removed_names.SUPPORT_CALLS:
        self.support_calls.append((node, removed_names.SUPPORT_CALLS[name]))
        return True
    advice = removed_names.reported(names)
    if advice:
      self._finding(node, Severity.WARNING, advice)
      return True
    return False

  def removed_imports_of(self, node: cst.Import | cst.ImportFrom) -> None:
    """Reports imports of removed modules; notes ``from jax import tree_map`` for removal."""
    if not self.rewrite_removed:
      return
    if isinstance(node, cst.Import):
      modules = [cst.Module([]).code_for_node(a.name) for a in node.names]
    else:
      module = cst.Module([]).code_for_node(node.module) if node.module else ""
      modules = [module]
      if not isinstance(node.names, cst.ImportStar):
        for alias in node.names:
          full = f"{module}.{alias.evaluated_name}"
          modules.append(full)
          if full in removed_names.TREE_RENAMES or full in removed_names.SUPPORT_CALLS:
            self.removed_imports.append((module, alias.evaluated_name, alias.evaluated_alias))
            self.removed_spellings.add(alias.evaluated_alias or alias.evaluated_name)
    advice = removed_names.reported(set(modules))
    if advice:
      self._finding(node, Severity.WARNING, advice)

  def visit_Import(self, node: cst.Import) -> bool:
    self.removed_imports_of(node)
    return False

  def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
    self.removed_imports_of(node)
    return False

  def visit_Attribute(self, node: cst.Attribute) -> bool:
    return not (node.attr.value in removed_names.LAST_NAMES and self.removed_name(node))

  def visit_Name(self, node: cst.Name) -> None:
    if node.value in self.removed_spellings:
      self.removed_name(node)

  # ----- pmap idioms -----

  def visit_Call(self, node: cst.Call) -> None:
    if self.removed_only:
      return
    if _is_reshape(node):
      self._reshape_depth += 1
    func = node.func
    last = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
    if last not in _LAST_NAMES:
      return  # qualified names are lazy and costly: only resolve plausible callees
    names = self._names(func)
    if self.rewrite_removed and names & (_REPLICATED | _SHARDED):
      return  # rewritten (the callee is recorded as a removed name)
    if names & _REPLICATED:
      self._add(node, "replicated")
    elif names & _SHARDED:
      self._add(node, "sharded")
    elif names & _UNREPLICATE:
      self._add(node, "unreplicate")
    elif names & _REPLICATE:
      self._add(node, "replicate")
    elif names & _LOCAL_COUNT and self._reshape_depth:
      self._add(node, "local_count")

  def leave_Call(self, original_node: cst.Call) -> None:
    if not self.removed_only and _is_reshape(original_node):
      self._reshape_depth -= 1

  def visit_Lambda(self, node: cst.Lambda) -> None:
    # `lambda x: x[0]`, the hand-written unreplicate.
    if self.removed_only:
      return
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

