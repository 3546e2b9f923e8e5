"""Rewrites JAX pmap sites into ``jax.jit(_pmap_as_shard_map(...))`` with equivalent specs.

Sites are found by meaning (QualifiedNameProvider): ``jax.pmap(f, ...)`` in any
spelling, ``partial(jax.pmap, ...)(f)``, and the decorators ``@jax.pmap`` /
``@partial(jax.pmap, ...)``. Each becomes

    jax.jit(_pmap_as_shard_map(f, axes=("i",), in_specs=P("i"), out_specs=P("i")),
            static_argnums=..., donate_argnums=...)

(or the same as two decorators), where ``_pmap_as_shard_map`` is a small helper added
to the file once (see ``codemod.runtime``). Directly nested pmaps (``pmap(pmap(f))``
or stacked decorators) become one shard_map over a multi-axis mesh. A site that cannot
be converted exactly is left as it is and reported as an ERROR with the reason;
related patterns (device_put_replicated, process_count, ...) get report entries.
"""
from __future__ import annotations

import bisect
from typing import Optional

import libcst as cst
from libcst.codemod import Codemod, CodemodContext, VisitorBasedCodemodCommand
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.metadata import PositionProvider, QualifiedNameProvider, ScopeProvider

from codemod import edits, runtime
from codemod.findings import Finding, Severity
from codemod.sites import (PARTIAL_NAMES, PmapOptions, References, Site, contains, int_tuple,
                           is_none, qualified)
from codemod.specs import NotLiteral, Unconvertible, read_axes, specs_source

DEFAULT_AXIS = "pmap_axis"
_SPEC_NAMES = frozenset({"jax.sharding.PartitionSpec", "jax.experimental.PartitionSpec",
                         "jax.experimental.pjit.PartitionSpec",
                         "jax._src.partition_spec.PartitionSpec"})
_INNER_FORBIDDEN = ("static_broadcasted_argnums", "donate_argnums", "devices", "backend",
                    "axis_size")


class ConvertPmapCommand(VisitorBasedCodemodCommand):
  """Rewrites every JAX pmap site into jax.jit over a shard_map with equivalent specs."""

  DESCRIPTION = "Rewrite jax.pmap sites into jax.jit(shard_map(...)) with equivalent specs."
  METADATA_DEPENDENCIES = (QualifiedNameProvider, ScopeProvider, PositionProvider)

  def __init__(self, context: CodemodContext, target: str = "experimental",
               multihost: bool = False, source: Optional[str] = None) -> None:
    super().__init__(context)
    self._source = source  # the file's text, when known: saves regenerating it
    if target not in ("experimental", "jax"):
      raise ValueError(f"target must be 'experimental' or 'jax', got {target!r}")
    self.target = target
    self.multihost = multihost
    self.findings: list[Finding] = []
    self.sites_found = 0
    self.sites_converted = 0
    self._call_sites: dict[cst.Call, cst.BaseExpression] = {}
    self._def_sites: dict[cst.FunctionDef, list[tuple[tuple, list[cst.Decorator]]]] = {}
    self._helper_before: Optional[int] = None
    self._p = "P"
    self._site_lines: list[int] = []
    self._module: Optional[cst.Module] = None
    self._lines: Optional[list[str]] = None
    self._imports_requested = False
    self._runtime_specs = False  # some site's axes are only known at run time
    self._pmap_imports: list[tuple[str, Optional[str]]] = []

  # ----- analysis (on the original tree, where metadata lives) -----

  def visit_Module(self, node: cst.Module) -> bool:
    self._module = node
    refs = References(self.get_metadata, self.multihost)
    node.visit(refs)
    self._pmap_imports = refs.pmap_imports
    ref_set = set(refs.refs)
    claimed: set = set()
    sites = self._find_sites(refs, ref_set, claimed)
    for ref in refs.refs:
      if ref not in claimed:
        self.sites_found += 1  # a site the codemod cannot convert, so it counts as reported
        self._report(ref, Severity.ERROR,
                     "pmap is used as a value here, not applied to a function, so the "
                     "codemod cannot see its arguments; convert it by hand or use "
                     "--strategy shim")
    self._link_nested(sites)
    self._check_bodies(sites, node)
    self._p = self._spec_name(node, sites)
    for site in sites:
      if site.absorbed:
        continue
      self.sites_found += 1
      self._convert(site)
    self.findings.extend(refs.findings)
    converted_nodes = [s.node for s in sites if not s.absorbed and s.error is None]
    if not converted_nodes:
      return False  # nothing to rewrite: skip the walk
    self._helper_before = self._first_statement_with(node, converted_nodes)
    self._site_lines = sorted(self.get_metadata(PositionProvider, n).start.line
                              for n in converted_nodes)
    return True

  def on_visit(self, node: cst.CSTNode) -> bool:
    # Only statements holding a converted site need their children walked.
    if self._site_lines and isinstance(node, (cst.BaseCompoundStatement, cst.SimpleStatementLine)):
      span = self.get_metadata(PositionProvider, node)
      at = bisect.bisect_left(self._site_lines, span.start.line)
      if at == len(self._site_lines) or self._site_lines[at] > span.end.line:
        super().on_visit(node)
        return False
    return super().on_visit(node)

  def _find_sites(self, refs: References, ref_set: set, claimed: set) -> list[Site]:
    sites: list[Site] = []
    for call in refs.calls:
      site = self._call_site(call, ref_set, claimed)
      if site is not None:
        sites.append(site)
    for fundef in refs.defs:
      sites.extend(self._decorator_sites(fundef, ref_set, claimed))
    return sites

  def _pmap_partial(self, node: cst.BaseExpression, ref_set: set) -> Optional[cst.Call]:
    """``node`` when it is ``partial(pmap, ...)``."""
    if (isinstance(node, cst.Call) and node.args and node.args[0].keyword is None
        and not node.args[0].star and node.args[0].value in ref_set
        and qualified(self.get_metadata, node.func) & PARTIAL_NAMES):
      return node
    return None

  def _call_site(self, call: cst.Call, ref_set: set, claimed: set) -> Optional[Site]:
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
    if fun is None:
      site.error = "pmap is called without a function (legacy pmap raises TypeError here)"
    return site

  def _decorator_sites(self, fundef: cst.FunctionDef, ref_set: set,
                       claimed: set) -> list[Site]:
    runs: list[list[tuple[int, PmapOptions, Optional[str]]]] = []
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
      if any("fun" in opts.values for _, opts, _ in run):
        error = "a pmap decorator passes `fun` itself, so the decorated def is not the function"
      else:
        error = next((err for _, _, err in run if err), None)
      outer: Optional[Site] = None
      for i, opts, _ in reversed(run):
        site = Site(fundef.decorators[i], opts, None, fundef=fundef,
                    decorators=tuple(j for j, _, _ in run), inner=outer)
        if outer is not None:
          outer.absorbed = True
        outer = site
      outer.error = error
      sites.append(outer)
    return sites

  def _link_nested(self, sites: list[Site]) -> None:
    by_node = {s.node: s for s in sites}
    for site in sites:
      inner = by_node.get(site.fun) if site.fun is not None else None
      if inner is not None:
        site.inner, inner.absorbed = inner, True

  def _check_bodies(self, sites: list[Site], module: cst.Module) -> None:
    """Pmaps inside a pmapped function's body, or inside a site's arguments: report."""
    nodes = {s.node for s in sites}
    by_node = {s.node: s for s in sites}
    for site in sites:
      if site.absorbed:
        continue
      inner = site.levels()[-1]
      for body in self._bodies(inner, module):
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

  def _bodies(self, site: Site, module: cst.Module) -> list[cst.CSTNode]:
    if site.fundef is not None:
      return [site.fundef.body]
    fun = site.fun
    if isinstance(fun, cst.Call) and qualified(self.get_metadata, fun.func) & PARTIAL_NAMES:
      fun = fun.args[0].value if fun.args else fun
    if isinstance(fun, cst.Lambda):
      return [fun.body]
    if isinstance(fun, cst.Name):
      scope = self.get_metadata(ScopeProvider, fun, None)
      if scope is not None and fun.value in scope:
        return [a.node.body for a in scope[fun.value]
                if isinstance(getattr(a, "node", None), cst.FunctionDef)]
    return []

  def _spec_name(self, module: cst.Module, sites: list[Site]) -> str:
    """``P`` unless the file binds ``P`` to something other than PartitionSpec."""
    for site in sites:
      scope = self.get_metadata(ScopeProvider, site.node, None)
      if scope is None:
        continue
      names = {q.name for q in scope.get_qualified_names_for("P")}
      if names - _SPEC_NAMES:
        return "jax.sharding.PartitionSpec"
    return "P"

  def _first_statement_with(self, module: cst.Module, nodes: list) -> int:
    lines = [self.get_metadata(PositionProvider, n).start.line for n in nodes]
    first = min(lines)
    for i, stmt in enumerate(module.body):
      if self.get_metadata(PositionProvider, stmt).end.line >= first:
        return i
    return len(module.body)

  # ----- building the replacement -----

  def _convert(self, site: Site) -> None:
    if site.error is None:
      try:
        self._build(site)
      except Unconvertible as e:
        site.error = str(e)
    if site.error is not None:
      self._report(site.node, Severity.ERROR, f"pmap left unchanged: {site.error}")
      return
    self.sites_converted += 1
    names = ", ".join(self._axis_names(site))
    self._report(site.node, Severity.INFO,
                 f"pmap converted to jax.jit(shard_map) over mesh axes {names}")

  def _axis_names(self, site: Site) -> list[str]:
    levels = site.levels()
    names = []
    for depth, level in enumerate(levels):
      given = level.options.get("axis_name")
      if given is None or is_none(given):
        names.append(f'"{DEFAULT_AXIS}"' if depth == 0 else f'"{DEFAULT_AXIS}_{depth}"')
      else:
        names.append(_code(given))
    if len(set(names)) != len(names):
      raise Unconvertible(f"the nested pmaps share an axis name ({', '.join(names)})")
    return names

  def _build(self, site: Site) -> None:
    levels = site.levels()
    outer = levels[0].options
    for level in levels:
      if level.options.get("global_arg_shapes") is not None:
        raise Unconvertible("global_arg_shapes is set (legacy pmap rejects it with ValueError)")
    for level in levels[1:]:
      for name in _INNER_FORBIDDEN:
        if level.options.get(name) is not None:
          raise Unconvertible(f"the inner of nested pmaps sets {name}")
    if len(levels) > 1 and outer.get("static_broadcasted_argnums") is not None:
      raise Unconvertible("nested pmaps with static_broadcasted_argnums")
    names = self._axis_names(site)
    in_specs = self._specs(levels, names, "in_axes")
    out_specs = self._specs(levels, names, "out_axes")
    static = outer.get("static_broadcasted_argnums")
    int_tuple(static, "static_broadcasted_argnums")
    int_tuple(outer.get("donate_argnums"), "donate_argnums")

    axes = f"({names[0]},)" if len(names) == 1 else f"({', '.join(names)})"
    helper_kw = [f"axes={axes}", f"in_specs={in_specs}",
                 f"out_specs={out_specs}"]
    jit_kw = []
    if static is not None:
      helper_kw.append(f"static_argnums={_code(static)}")
      jit_kw.append(f"static_argnums={_code(static)}")
    for name in ("axis_size", "devices", "backend"):
      if outer.get(name) is not None and not is_none(outer.get(name)):
        helper_kw.append(f"{name}={_code(outer.get(name))}")
    donate = outer.get("donate_argnums")
    if donate is not None:
      jit_kw.append(f"donate_argnums={_code(donate)}")

    pos = self.get_metadata(PositionProvider, site.node).start
    base = self._indent_of(pos.line)
    if site.fundef is None:
      fun = levels[-1].fun
      column = pos.column + (len(runtime.HOST_LOCAL_NAME) + 1 if self.multihost else 0)
      inner = edits.format_call(runtime.HELPER_NAME, [_code(fun)] + helper_kw, base + edits.HANG * 2,
                           len(base + edits.HANG))
      text = edits.format_call("jax.jit", [inner] + jit_kw, base + edits.HANG, column)
      if self.multihost:
        text = f"{runtime.HOST_LOCAL_NAME}({text})"
      self._call_sites[site.node] = edits.parse_expression(text)
    else:
      partial = self._partial_spelling(levels)
      column = len(base) + 1
      jit = (edits.format_call(partial, ["jax.jit"] + jit_kw, base + edits.HANG, column)
             if jit_kw else "jax.jit")
      decorators = [jit, edits.format_call(partial, [runtime.HELPER_NAME] + helper_kw,
                                      base + edits.HANG, column)]
      if self.multihost:
        decorators.insert(0, runtime.HOST_LOCAL_NAME)
      first = site.fundef.decorators[site.decorators[0]]
      new = [cst.Decorator(edits.parse_expression(d)) for d in decorators]
      new[0] = new[0].with_changes(leading_lines=first.leading_lines)
      self._def_sites.setdefault(site.fundef, []).append((site.decorators, new))
    self._add_imports(need_functools=site.fundef is not None)

  def _indent_of(self, line: int) -> str:
    if self._lines is None:
      self._lines = (self._source if self._source is not None else self._module.code).splitlines()
    text = self._lines[line - 1] if line - 1 < len(self._lines) else ""
    return text[:len(text) - len(text.lstrip())]

  def _specs(self, levels: list[Site], names: list[str], what: str) -> str:
    """Spec source for in_axes / out_axes: literal when they are, else converted at run time."""
    try:
      trees = [self._axes(level.options, what) for level in levels]
    except NotLiteral:
      if len(levels) > 1:
        raise
      self._runtime_specs = True
      expr = _code(levels[0].options.get(what))
      return f"{runtime.SPECS_NAME}({expr}, {names[0]}, outputs={what == 'out_axes'})"
    return specs_source(trees, names, self._p, outputs=what == "out_axes", what=what)

  def _axes(self, options: PmapOptions, name: str):
    node = options.get(name)
    return 0 if node is None else read_axes(node, name)

  def _partial_spelling(self, levels: list[Site]) -> str:
    for level in levels:
      expr = level.node.decorator
      if isinstance(expr, cst.Call):
        return _code(expr.func)
    return "functools.partial"

  def _add_imports(self, need_functools: bool) -> None:
    # AddImportsVisitor repeats an aliased import once per request, so ask once.
    if self._imports_requested:
      return
    self._imports_requested = True
    ctx = self.context
    AddImportsVisitor.add_needed_import(ctx, "jax")
    AddImportsVisitor.add_needed_import(ctx, "functools")
    if self._p == "P":
      AddImportsVisitor.add_needed_import(ctx, "jax.sharding", "PartitionSpec", "P")
    if self.target == "experimental":
      AddImportsVisitor.add_needed_import(ctx, "jax.experimental.shard_map", "shard_map")
    for module, alias in self._pmap_imports:
      RemoveImportsVisitor.remove_unused_import(ctx, module, "pmap", alias)

  def _report(self, node: cst.CSTNode, severity: Severity, message: str) -> None:
    pos = self.get_metadata(PositionProvider, node).start
    self.findings.append(Finding(pos.line, pos.column + 1, severity, message))

  # ----- applying it -----

  def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
    replacement = self._call_sites.get(original_node)
    if replacement is None:
      return updated_node
    return replacement.with_changes(lpar=updated_node.lpar, rpar=updated_node.rpar)

  def leave_FunctionDef(self, original_node: cst.FunctionDef,
                        updated_node: cst.FunctionDef) -> cst.FunctionDef:
    runs = self._def_sites.get(original_node)
    if not runs:
      return updated_node
    replace = {indices[0]: (set(indices), new) for indices, new in runs}
    out: list[cst.Decorator] = []
    skip: set = set()
    for i, dec in enumerate(updated_node.decorators):
      if i in replace:
        skip, new = replace[i]
        out.extend(new)
      elif i not in skip:
        out.append(dec)
    return updated_node.with_changes(decorators=out)

  def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
    if self._helper_before is None or self._helper_before >= len(updated_node.body):
      return updated_node
    # Mark the statement the helpers go before; the import passes may rebuild it.
    body = list(updated_node.body)
    at = self._helper_before
    body[at] = edits.mark_anchor(body[at])
    return updated_node.with_changes(body=body)

  def transform_module(self, tree: cst.Module) -> cst.Module:
    """Runs the rewrite and the import passes, then adds the helper block (once)."""
    tree = Codemod.transform_module(self, tree)  # this command's own pass
    tree = edits.add_imports_in_head(tree, self.context)
    if RemoveImportsVisitor.CONTEXT_KEY in self.context.scratch:
      tree = RemoveImportsVisitor(self.context).transform_module(tree)
    if self._helper_before is None:
      return tree
    return edits.insert_helpers(tree, self.target, self.multihost, self._runtime_specs)


def _code(node: cst.CSTNode) -> str:
  return cst.Module([]).code_for_node(node)
