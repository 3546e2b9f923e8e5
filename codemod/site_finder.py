"""The pmap sites of a module, found among its references to pmap (``sites.References``).

A site is a reference applied to a function: ``pmap(f, ...)``, ``partial(pmap, ...)(f)``
(``partial`` spelled any way, or a module-level alias of it), or a run of pmap decorators
on one def, one ``Site`` per run whose levels nest outer first. A pmap applied directly to
another's site (``pmap(pmap(f))``) becomes that site's inner level. A pmap inside a pmapped
function's body, or inside a site's arguments, marks the sites involved with an error: the
two need one shard_map over a 2-D mesh, which is not statically clear there. References no
site claims are pmap handed around as a value.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import libcst as cst
from libcst.metadata import PositionProvider, ScopeProvider

from codemod.axes_to_specs import Unconvertible
from codemod.sites import PARTIAL_NAMES, PmapOptions, References, Site, contains, qualified


@dataclass
class Found:
  sites: list[Site]  # absorbed inner levels included (``Site.absorbed``)
  values: list[cst.CSTNode]  # references that no site claims: pmap used as a value


class SiteFinder:
  """Finds the sites of one module, reading the metadata of its original tree."""

  def __init__(self, module: cst.Module, get_metadata: Callable[..., Any]):
    self.get_metadata = get_metadata
    self._partial_aliases = self._partial_aliases_of(module)

  def find(self, refs: References) -> Found:
    ref_set = set(refs.refs)
    claimed: set = set()
    sites: list[Site] = []
    for call in refs.calls:
      site = self._call_site(call, ref_set, claimed)
      if site is not None:
        sites.append(site)
    for fundef in refs.defs:
      sites.extend(self._decorator_sites(fundef, ref_set, claimed))
    self._link_nested(sites)
    self._check_bodies(sites)
    values = [r for r in refs.refs if r not in claimed and r not in refs.metadata_only]
    return Found(sites, values)

  def _pmap_partial(self, node: cst.BaseExpression, ref_set: set) -> cst.Call | None:
    """``node`` when it is ``partial(pmap, ...)``."""
    if (isinstance(node, cst.Call) and node.args and node.args[0].keyword is None
        and not node.args[0].star and node.args[0].value in ref_set
        and self.is_partial(node.func)):
      return node
    return None

  def _partial_aliases_of(self, module: cst.Module) -> frozenset[str]:
    """Module-level names bound once to functools.partial (``partial = functools.partial``)."""
    aliases = set()
    for stmt in module.body:
      if not isinstance(stmt, cst.SimpleStatementLine):
        continue
      for small in stmt.body:
        if (isinstance(small, cst.Assign) and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name)
            and qualified(self.get_metadata, small.value) & PARTIAL_NAMES):
          aliases.add(small.targets[0].target.value)
    scope = self.get_metadata(ScopeProvider, module, None)
    return frozenset(a for a in aliases if scope is None or len(scope[a]) == 1)

  def is_partial(self, node: cst.BaseExpression) -> bool:
    """Whether ``node`` names functools.partial (or the module's alias of it)."""
    if qualified(self.get_metadata, node) & PARTIAL_NAMES:
      return True
    if not (isinstance(node, cst.Name) and node.value in self._partial_aliases):
      return False
    scope = self.get_metadata(ScopeProvider, node, None)
    # The module-level alias, unless a local name shadows it here.
    targets = [getattr(a, "node", None) for a in scope[node.value]] if scope is not None else []
    return bool(targets) and all(
        t is not None and isinstance(self.get_metadata(ScopeProvider, t, None),
                                     cst.metadata.GlobalScope) for t in targets)

  def _call_site(self, call: cst.Call, ref_set: set, claimed: set) -> Site | None:
    if call.func in ref_set:
      ref, base, skip = call.func, PmapOptions(), 0
    else:
      partial = self._pmap_partial(call.func, ref_set)
      if partial is None:
        return None
      ref = partial.args[0].value
      base, skip = PmapOptions(), 0
      try:
        base = base.merged(list(partial.args[1:]))
      except Unconvertible as e:
        claimed.add(ref)
        return Site(call, PmapOptions(), None, error=str(e))
    claimed.add(ref)
    try:
      options = base.merged(list(call.args), skip)
    except Unconvertible as e:
      return Site(call, base, None, error=str(e))
    fun = options.get("fun")
    site = Site(call, options, fun)
    if fun is None and not options.starred:
      site.error = "pmap is called without a function (legacy pmap raises TypeError here)"
    return site

  def _decorator_sites(self, fundef: cst.FunctionDef, ref_set: set,
                       claimed: set) -> list[Site]:
    runs: list[list[tuple[int, PmapOptions, str | None]]] = []
    entry: tuple[int, PmapOptions, str | None]
    previous = -2
    for i, dec in enumerate(fundef.decorators):
      expr = dec.decorator
      partial = self._pmap_partial(expr, ref_set)
      if expr in ref_set:
        claimed.add(expr)
        entry = (i, PmapOptions(), None)
      elif partial is not None:
        claimed.add(partial.args[0].value)
        try:
          entry = (i, PmapOptions().merged(list(partial.args[1:])), None)
        except Unconvertible as e:
          entry = (i, PmapOptions(), str(e))
      else:
        continue
      if i == previous + 1:
        runs[-1].append(entry)
      else:
        runs.append([entry])
      previous = i
    sites = []
    for run in runs:
      error: str | None
      if any("fun" in opts.values for _, opts, _ in run):
        error = "a pmap decorator passes `fun` itself, so the decorated def is not the function"
      else:
        error = next((err for _, _, err in run if err), None)
      outer: Site | None = None
      for i, opts, _ in reversed(run):
        site = Site(fundef.decorators[i], opts, None, fundef=fundef,
                    decorators=tuple(j for j, _, _ in run), inner=outer)
        if outer is not None:
          outer.absorbed = True
        outer = site
      assert outer is not None  # a run has at least one decorator
      outer.error = error
      sites.append(outer)
    return sites

  def _link_nested(self, sites: list[Site]) -> None:
    by_node = {s.node: s for s in sites}
    for site in sites:
      inner = by_node.get(site.fun) if site.fun is not None else None
      if inner is not None:
        site.inner, inner.absorbed = inner, True

  def _check_bodies(self, sites: list[Site]) -> None:
    """Pmaps inside a pmapped function's body, or inside a site's arguments: report."""
    nodes = {s.node for s in sites}
    by_node = {s.node: s for s in sites}
    for site in sites:
      if site.absorbed:
        continue
      inner = site.levels()[-1]
      for body in self._bodies(inner):
        for found in contains(body, nodes):
          other = by_node[found]
          message = ("a pmap inside the body of a pmapped function: the two need one "
                     "shard_map over a 2-D mesh, which is not statically clear here; "
                     "nest the pmaps directly (pmap(pmap(f))) or convert by hand")
          site.error = site.error or message
          other.error = other.error or message
      for level in site.levels():
        for value in level.options.values.values():
          skip = level.inner.node if level.inner is not None else None
          if value is skip:
            continue
          if contains(value, nodes - {skip}):
            site.error = site.error or "another pmap site appears inside this site's arguments"

  def _bodies(self, site: Site) -> list[cst.CSTNode]:
    if site.fundef is not None:
      return [site.fundef.body]
    fun = site.fun
    if isinstance(fun, cst.Call) and self.is_partial(fun.func):
      fun = fun.args[0].value if fun.args else fun
    if isinstance(fun, cst.Lambda):
      return [fun.body]
    if isinstance(fun, cst.Name):
      scope = self.get_metadata(ScopeProvider, fun, None)
      if scope is not None and fun.value in scope:
        return [d.body for d in self._defs_reaching(fun, scope)]
    return []

  def _defs_reaching(self, use: cst.Name, scope) -> list[cst.FunctionDef]:
    """The defs of ``use``'s name that it can mean: the last one before it in the same
    scope (a later cell or statement that redefines the name does not count), else all."""
    defs = []
    for assignment in scope[use.value]:
      node = getattr(assignment, "node", None)  # a builtin (abs) has none
      if isinstance(node, cst.FunctionDef):
        defs.append(node)
    line = self.get_metadata(PositionProvider, use).start.line
    before = [d for d in defs if self.get_metadata(PositionProvider, d).end.line < line]
    if before:
      return [max(before, key=lambda d: self.get_metadata(PositionProvider, d).start.line)]
    return defs
