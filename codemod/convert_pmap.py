"""Rewrites JAX pmap sites into ``jax.jit`` over ``jax.shard_map`` with equivalent specs.

The command is a pipeline of rewrites that share one resolution of libcst's metadata and
one walk of the tree (a libcst command per rewrite would resolve the metadata again for
each, which costs as much as the whole rewrite). On the original tree, where the metadata
lives, each rewrite plans its changes keyed by the nodes they replace:

  analysis      ``sites.References`` and ``site_finder`` (the sites, found by meaning: any
                spelling of ``jax.pmap(f, ...)``, ``partial(jax.pmap, ...)(f)``, the
                decorators) with ``unreplicate``'s collector, in one read-only walk
  patches       ``pmap_patches``: the sites that may run where the file (or the run)
                replaces jax.pmap are left as they are, and reported
  sites         ``site_forms``: each site's new code, laid out by ``site_layout`` with its
                comments, its mesh a statement ``site_meshes`` places
  pmap values   pmap handed around as a value becomes ``pmap_via_shard_map`` (here)
  row access    ``unreplicate``: ``x[0]`` of converted outputs becomes ``first_row(x)``
                (``row_access`` runs it alone over code an earlier run converted)
  removed names ``removed_apis`` (``--target jax``; also a libcst command of its own)

then one transforming walk applies every plan, ``imports`` puts the new imports in their
groups (``add_imports`` is that step as a libcst command, for imports other commands
schedule) and ``unused_imports`` drops those the rewrite left unread. Findings go to the
context's warnings (``self.warn``), one ``line:col SEVERITY message`` each; the site
counts to ``context.scratch``.
"""
from __future__ import annotations

import argparse
import bisect
import functools
import os
import re
import tokenize
from collections.abc import Mapping
from typing import Any, cast

import libcst as cst
from libcst.codemod import Codemod, CodemodContext, VisitorBasedCodemodCommand
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.metadata import CodeRange, PositionProvider, QualifiedNameProvider, ScopeProvider

from codemod import (imports, matcher_setup, placed_devices, pmap_patches, public_api, removed_apis,
                     removed_names, site_calls, site_forms, site_layout, site_meshes, source_text,
                     support_module, targets, together, transform_tables, unreplicate,
                     unused_imports)
from codemod.axes_to_specs import Unconvertible
from codemod.findings import SITES_KEY, Finding, Severity
from codemod.site_finder import Found, SiteFinder
from codemod.sites import References, Site

TARGETS = targets.TARGETS
_INITIALIZE = re.compile(r"\bdistributed\.initialize\(|\bfrom jax\.distributed import")


class ConvertPmapCommand(VisitorBasedCodemodCommand):
  """Rewrites every JAX pmap site into jax.jit over a shard_map with equivalent specs."""

  DESCRIPTION = "Rewrite jax.pmap sites into jax.jit(shard_map(...)) with equivalent specs."
  METADATA_DEPENDENCIES = (QualifiedNameProvider, ScopeProvider, PositionProvider)

  @staticmethod
  def add_args(arg_parser: argparse.ArgumentParser) -> None:
    arg_parser.add_argument(
        "--target", choices=TARGETS, default=None,
        help="shard_map API to emit: jax.experimental.shard_map (jax < 0.6.1) or "
             "jax.shard_map; jax also rewrites names newest JAX removed (default: the one "
             "that runs on the jax the file's repository declares, else on the installed jax)")
    arg_parser.add_argument(
        "--multihost", action="store_true",
        help="accepted for old command lines: every converted site is multi-host correct")
    arg_parser.add_argument(
        "--support-module", default=support_module.DEFAULT_NAME, metavar="MODULE",
        help="dotted name the converted files import the shared run-time helpers from")
    arg_parser.add_argument(
        "--support-root", default=None, metavar="DIR",
        help="write the support module under DIR when a file is converted (libcst's runner; "
             "the project CLI chooses and writes it itself)")

  def __init__(self, context: CodemodContext, target: str | None = None,
               multihost: bool = False, support_module: str | None = support_module.DEFAULT_NAME,
               support_root: str | None = None, source: str | None = None,
               caller_writes_support: bool = False,
               pmap_patchers: frozenset[str] = pmap_patches.KNOWN_PATCHERS,
               module_replacements: tuple[pmap_patches.ModuleReplacement, ...] = (),
               run_names: Mapping[str, str] | None = None) -> None:
    Codemod.__init__(self, context)
    matcher_setup.init_matchers(self)
    if target is not None and target not in TARGETS:
      raise ValueError(f"target must be 'experimental' or 'jax', got {target!r}")
    self._target_option = target  # None: each file's own (targets.for_file)
    self.target = target or "jax"
    del multihost  # every site is converted for any number of processes
    self.support_module = support_module
    self.support_root = support_root
    self.caller_writes_support = caller_writes_support  # the project CLI does
    self._source = source  # the file's text, when the caller has it: saves regenerating it
    self._pmap_patchers = pmap_patchers
    self._module_replacements = module_replacements
    self._run_names = run_names or {}  # see support_module.run_names_of
    self._reset()

  def _reset(self) -> None:
    """Per-file state (libcst's runner reuses one command for many files)."""
    self.sites_found = 0
    self.sites_converted = 0
    self._renames = removed_apis.Renames()  # names replaced: removed ones, pmap as a value
    self._site_lines: list[int] = []
    self._edited_lines: set[int] = set()  # lines holding code the rewrite replaces
    self._module: cst.Module | None = None
    self._text = source_text.SourceText("")
    self._layout = site_layout.SiteLayout(self._text, self._position, lambda _: False)
    self._imports_requested = False
    self._support_names: list[str] = []
    self._support_flags: set[str] = set()  # support_module.FEATURES the sites need
    self._shard_map = "shard_map"  # how --target experimental's sites call it
    self._pmap_imports: list[tuple[str, str | None]] = []
    self._pmap_module_imports: list[tuple[str, str | None]] = []
    self._unreplicate = unreplicate.Rewrites()
    self._walked_idioms: cst.CSTVisitor | None = None  # walked with References, for plan()
    self._meshes = site_meshes.MeshPlan(cst.Module([]), self.get_metadata, set())

  def transform_module_impl(self, tree: cst.Module) -> cst.Module:
    self._reset()
    path = self.context.filename
    choice = targets.for_file(path if path and os.path.isfile(path) else None,
                              self._target_option)
    self.target = choice.target
    self._choice = choice
    # libcst's runner writes the module itself (a name, never None: that is for notebooks).
    written = self.support_module or support_module.DEFAULT_NAME
    if self.support_root is not None:
      status = support_module.status_at(self.support_root, written)
      if status is support_module.Status.FOREIGN:
        self._warn(1, 1, Severity.ERROR, support_module.foreign_message(
            self.support_root, written))
        return tree
    new = super().transform_module_impl(tree)
    # Decided here from the metadata at hand, the removals spare libcst's second pass.
    new = unused_imports.apply(self.context, new, self._scopes, self.get_metadata,
                               self._edited_lines, lambda: new.code,
                               unused_imports.names_read(self._written()))
    if not self._layout.all_applied:
      raise RuntimeError("a site planned for conversion was not rewritten")
    self.context.scratch[SITES_KEY] = (self.sites_found, self.sites_converted)
    note = choice.note()
    if self.sites_converted and note is not None:
      self._warn(1, 1, Severity.WARNING, note)
    if self.sites_converted and self.support_root is not None:
      support_module.write(self.support_root, written,
                           self.context.scratch.get(support_module.NAMES_KEY, ()))
    elif self.sites_converted and not self.caller_writes_support:
      self._warn(1, 1, Severity.WARNING,
                 f"the converted sites import {self.support_module}, which this run does not "
                 "write: pass --support-root DIR (the directory on sys.path when the code "
                 "runs), or run python -m codemod.pmap_to_shmap")
    return new

  # ----- analysis (on the original tree, where metadata lives) -----

  def visit_Module(self, node: cst.Module) -> bool:
    self._module = node
    self._finder = SiteFinder(node, self.get_metadata)
    path = self.context.filename
    text = self._source if self._source is not None else node.code
    self._text = source_text.SourceText(text, path if path and os.path.isfile(path) else None)
    self._layout = site_layout.SiteLayout(self._text, self._position, self._finder.is_partial)
    # One walk, rebuilding nothing, for every analysis of the whole module.
    refs = References(self.get_metadata, self.target)
    self._walked_idioms = unreplicate.collector(self.get_metadata, text)
    together.walk(node, [refs, cast(cst.CSTVisitor, self._walked_idioms)])
    self._pmap_imports = refs.pmap_imports
    self._pmap_module_imports = sorted(refs.pmap_module_imports, key=str)
    found = self._finder.find(refs)
    sites = found.sites
    if set(refs.refs) - refs.metadata_only and self._leave_if_patched(text, found, refs):
      return False
    self._leave_tables(node, found)
    for ref in found.values:
      self.sites_found += 1
      self._value_use(ref, refs)
    # Sites with a named axis first: an unnamed one may then run on their body's mesh,
    # and leaves the meshes' names alone.
    sites = sorted(sites, key=site_forms.unnamed)
    axes = set()
    for site in [s for s in sites if not site_forms.unnamed(s)] or sites:
      try:
        axes.add(tuple(site_forms.axis_names(site, self._text.style.quote)))
      except Unconvertible:
        pass
    calls = site_calls.SiteCalls(self.get_metadata, refs.calls)
    identifiers = {t.string for t in self._text.tokens if t.type == tokenize.NAME}
    self._meshes = site_meshes.MeshPlan(
        node, self.get_metadata, identifiers,
        by_axis=len(axes) > 1, cache=_cache_spelling(node, self.get_metadata),
        placed=placed_devices.PlacedDevices(node, self.get_metadata, refs.calls),
        sites=[s.node for s in sites if not s.absorbed],
        feeds=functools.partial(_feed, {s.node: s for s in sites}, calls))
    # A module-level mesh starts JAX's backend at import: not in a library module (whoever
    # imports it may call jax.distributed.initialize after) nor in a program that calls
    # it. Their module-level sites are made on their first call (on_first_call).
    imported_before_jax_starts = bool(
        (path and os.path.isfile(path) and (
            support_module.package_of(path) is not None
            or os.path.dirname(os.path.abspath(path)) in self._run_names))
        or _INITIALIZE.search(self._text.text))
    self._shard_map = site_forms.shard_map_name(self.get_metadata, sites, identifiers)
    forms = site_forms.SiteForms(
        module=node, get_metadata=self.get_metadata, text=self._text, layout=self._layout,
        meshes=self._meshes, renames=self._renames, choice=self._choice,
        spec=site_forms.spec_name(self.get_metadata, sites),
        shard_map=self._shard_map, report=self._report,
        library_module=(public_api.module_name(path) if path and os.path.isfile(path)
                        else None),
        imported_before_jax_starts=imported_before_jax_starts, calls=calls)
    for site in sites:
      if site.absorbed:
        continue
      self.sites_found += 1
      forms.convert(site)
    self.sites_converted += forms.converted
    self._support_flags |= forms.support_flags
    if forms.converted:
      self._add_imports(forms.support_names)
    converted = [s for s in sites if not s.absorbed and s.error is None]
    if forms.converted:
      self._drop_partial_imports(node, converted)
    if self.sites_converted:
      self._plan_unreplicate(node, converted)
    for finding in self._unreplicate.kept(refs.findings) + self._unreplicate.findings:
      self._warn(finding.line, finding.column, finding.severity, finding.message)
    self._plan_renames(refs)
    converted_nodes = [s.node for s in converted]
    edited = converted_nodes + list(self._renames.nodes) + self._unreplicate.nodes
    if not edited:
      return False  # nothing to rewrite: skip the walk
    self._site_lines = sorted(self.get_metadata(PositionProvider, n).start.line
                              for n in edited)
    for n in edited + [d for s in converted if s.fundef is not None for d in s.fundef.decorators]:
      span = self.get_metadata(PositionProvider, n)
      self._edited_lines.update(range(span.start.line, span.end.line + 1))
    return True

  def _leave_tables(self, module: cst.Module, found: Found) -> None:
    """Where pmap is in a table of JAX transforms that the code inspects, every value use
    of pmap in the file stays jax.pmap (so its comparisons with the table hold) and is
    reported; ``found`` then holds none to convert."""
    tables = transform_tables.inspected(module, self.get_metadata, found.values)
    if not tables:
      return
    line = self._start_line(tables[0])
    for ref in found.values:
      self.sites_found += 1
      self._report(ref, Severity.ERROR, "pmap left unchanged: " + (
          "listed here with other JAX transforms, whose loop inspects them or what they "
          "return (not only runs them), to compare with values made elsewhere, where "
          "callers still have jax.pmap" if ref in tables else
          f"pmap is in a table of JAX transforms at line {line}, which this value may be "
          "compared with") + "; convert it by hand where it only runs pmap")
    found.values.clear()

  def _drop_partial_imports(self, module: cst.Module, converted: list[Site]) -> None:
    """``from functools import partial`` (or ``import functools``) that a converted site
    read (``@partial(jax.pmap, ...)``) may have no reader left: scheduled for removal,
    which happens only where nothing reads it any more."""
    read: set[str] = set()
    for site in converted:
      read |= unused_imports.names_read(cst.Module([]).code_for_node(site.node)) or set()
    found: list[tuple[str, str | None, str | None]]
    for stmt in module.body:
      for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
        if isinstance(small, cst.Import):
          found = [("functools", None, a.evaluated_alias) for a in small.names
                   if a.evaluated_name == "functools"]
        elif (isinstance(small, cst.ImportFrom) and not small.relative
              and small.module is not None and not isinstance(small.names, cst.ImportStar)
              and cst.Module([]).code_for_node(small.module) == "functools"):
          found = [("functools", "partial", a.evaluated_alias) for a in small.names
                   if a.evaluated_name == "partial"]
        else:
          continue
        for module_name, name, alias in found:
          if (alias or name or module_name) in read:
            RemoveImportsVisitor.remove_unused_import(self.context, module_name, name, alias)

  def _position(self, node: cst.CSTNode) -> CodeRange:
    return self.get_metadata(PositionProvider, node)

  def _scopes(self) -> set:
    """Every scope of the original module."""
    found = set(self.metadata[ScopeProvider].values())
    found.discard(None)
    return found

  def on_visit(self, node: cst.CSTNode) -> bool:
    # Only statements holding a converted site need their children walked.
    if self._site_lines and isinstance(node, (cst.BaseCompoundStatement, cst.SimpleStatementLine)):
      span = self.get_metadata(PositionProvider, node)
      # A def's or class's position starts at its keyword; its decorators come before.
      decorators = getattr(node, "decorators", ())
      start = (self.get_metadata(PositionProvider, decorators[0]).start.line if decorators
               else span.start.line)
      at = bisect.bisect_left(self._site_lines, start)
      if at == len(self._site_lines) or self._site_lines[at] > span.end.line:
        super().on_visit(node)
        return False
    return super().on_visit(node)

  def _import_support(self, name: str) -> None:
    if name not in self._support_names:
      self._support_names.append(name)

  def _add_imports(self, support_names: list[str]) -> None:
    """The support names the new code calls; the first call also drops the pmap imports
    nothing reads any more."""
    for name in support_names:
      self._import_support(name)
    if self._imports_requested:
      return
    self._imports_requested = True
    for module, alias in self._pmap_imports:
      RemoveImportsVisitor.remove_unused_import(self.context, module, "pmap", alias)
    # `import jax` (under any name) may have served `jax.pmap` alone.
    for module, alias in self._pmap_module_imports:
      RemoveImportsVisitor.remove_unused_import(self.context, module, None, alias)

  def _written(self) -> str:
    """The code the rewrite writes at the sites (calls, renames, row access, decorators),
    a piece per line."""
    written = self._layout.code() + self._renames.code()
    written += self._unreplicate.code()
    written += self._meshes.decorators() + self._meshes.device_lists()
    return "\n".join(written)

  def _wanted_imports(self, module: cst.Module) -> list[imports.Wanted]:
    """The imports the new code uses that the module does not bind yet."""
    text = self._written()
    candidates = [imports.Wanted("jax"), imports.Wanted("functools"),
                  imports.Wanted("jax.sharding", "PartitionSpec", "P")]
    if "." not in self._shard_map:  # not through the module the file binds
      candidates.append(imports.Wanted(site_forms.EXPERIMENTAL_SHARD_MAP, "shard_map",
                                       None if self._shard_map == "shard_map"
                                       else self._shard_map))
    if "@cache" in self._meshes.decorators():
      candidates.append(imports.Wanted("functools", "cache"))
    support = support_module.import_of(self.support_module)
    if support is not None:
      module_name, relative = support
      candidates += [imports.Wanted(module_name, name, relative=relative)
                     for name in self._support_names]
    self.context.scratch[support_module.NAMES_KEY] = tuple(
        name for name in self._support_names if imports.uses(text, name)) + tuple(
        sorted(self._support_flags))
    scope = self.get_metadata(ScopeProvider, module, None)
    return [w for w in candidates if imports.uses(text, w.bound) and not imports.binds(scope, w)]

  def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
    wanted = self._wanted_imports(original_node)
    if not wanted:
      return updated_node
    # ``from jax import device_put_replicated``, whose calls now use the support module's
    # function of that name: the support import would redefine it (ruff F811).
    replaced = {w.name for w in wanted if w.name in removed_names.SUPPORT_CALLS.values()}
    updated_node = imports.without(updated_node, ("jax", "jax.api"), replaced)
    return imports.add_to_file(updated_node, wanted, self._text.style, self.context.filename)

  # ----- names newest JAX removed (--target jax) -----

  def _plan_renames(self, refs: References) -> None:
    if self.target != "jax":
      return
    known = len(self._renames.findings)
    removed_apis.plan(refs, lambda node: self.get_metadata(PositionProvider, node),
                      self.support_module, functools.partial(support_module.taken,
                                                             self.get_metadata),
                      into=self._renames)
    for finding in self._renames.findings[known:]:
      self._warn(finding.line, finding.column, finding.severity, finding.message)
    for name in self._renames.support_names:
      self._import_support(name)
    for module, name, alias in self._renames.removed_imports:
      RemoveImportsVisitor.remove_unused_import(self.context, module, name, alias)

  def _leave_if_patched(self, text: str, found: Found, refs: References) -> bool:
    """Whether the file's pmap may be replaced while any of its code runs
    (``pmap_patches``): then its sites are reported and left as they are. The sites that
    run under a patch of jax.pmap in the file are marked to be left (``site.error``)."""
    if (patch := pmap_patches.patched(text, self._pmap_patchers)) is not None:
      self._warn(patch.first.line, patch.first.column, Severity.WARNING,
                 f"{patch.first.how} replaces jax.pmap while it runs: the pmap sites of this "
                 "file that may run under it are left as they are, and code converted "
                 "elsewhere no longer calls jax.pmap, so the replacement no longer reaches "
                 "it")
      def why(node: cst.CSTNode) -> str | None:
        at = patch.patch_at(self._start_line(node))
        return None if at is None else (
            f"it may run where the file replaces jax.pmap (line {at.line}), so it may run "
            "the replacement; convert it by hand where it runs JAX's pmap")

      for site in found.sites:
        if not site.absorbed and (error := why(site.node)):
          site.error = error
      for node, error in [(n, why(n)) for n in found.values if n not in refs.bound]:
        if error:
          found.values.remove(node)
          self.sites_found += 1
          self._report(node, Severity.ERROR, f"pmap left unchanged: {error}")
      return False
    line = pmap_patches.pmap_import_line(text)
    replaced = (pmap_patches.replacing(self.context.filename, self._module_replacements)
                if line is not None and self.context.filename else None)
    if line is None or replaced is None:
      return False
    where = f"{replaced.path}:{replaced.line}"
    whose = ("this module's pmap" if replaced.module
             else "the pmap of a module it is given, which may be this one,")
    self._warn(line, 1, Severity.WARNING,
               f"{replaced.how} ({where}) replaces {whose} while it runs: this file's pmap "
               "sites are left as they are, since converted code would no longer call the "
               "replacement")
    self._leave_sites(found, refs, f"{where} may replace this module's pmap")
    return True

  def _start_line(self, node: cst.CSTNode) -> int:
    return self.get_metadata(PositionProvider, node).start.line

  def _leave_sites(self, found: Found, refs: References, why: str) -> None:
    """Reports every site of a file, leaving them as they are."""
    left = [s.node for s in found.sites if not s.absorbed] + found.values
    for node in left:
      self.sites_found += 1
      if node in refs.bound:
        self._value_use(node, refs)  # says so, converting nothing
        continue
      self._report(node, Severity.ERROR,
                   f"pmap left unchanged: {why}, so this may run the replacement; convert "
                   "it by hand where it runs JAX's pmap")
    for finding in refs.findings:
      self._warn(finding.line, finding.column, finding.severity, finding.message)

  def _value_use(self, ref: cst.CSTNode, refs: References) -> None:
    """pmap handed around as a value (``apply(jax.pmap, f)``, ``return jax.pmap``): the
    support module's function with pmap's signature takes its place, converting each pmap
    it makes when it runs. Where the name is bound or deleted, it is reported."""
    if ref in refs.bound:
      self._report(ref, Severity.ERROR,
                   "pmap is bound or deleted here, not applied to a function: convert it by "
                   "hand or use --strategy shim")
      return
    value_pmap = site_forms.VALUE_PMAP
    if support_module.taken(self.get_metadata, ref, [value_pmap]):
      self._report(ref, Severity.ERROR,
                   f"pmap left unchanged: the file binds {value_pmap}, which would replace "
                   "it from the support module: rename it, then rerun")
      return
    self.sites_converted += 1
    self._renames.replace(ref, cst.Name(value_pmap), self._start_line(ref))
    self._add_imports([value_pmap])
    # Whoever calls it may pass any of pmap's options.
    self._support_flags |= site_forms.via_flags(self._choice, static=True)
    self._report(ref, Severity.INFO,
                 f"pmap used as a value here rewritten to {value_pmap} (support module): "
                 "pmap's signature over jax.jit and shard_map, converting each pmap it makes "
                 "when it runs, as the codemod does where it sees the call")

  # ----- x[0] of the converted sites' outputs -----

  def _plan_unreplicate(self, module: cst.Module, converted: list[Site]) -> None:
    self._unreplicate = unreplicate.plan(
        module, self.get_metadata, [s.node for s in converted if s.fundef is None],
        [s.fundef for s in converted if s.fundef is not None], self._text.style.width,
        self._text.lines,
        walked=self._walked_idioms)
    for name in self._unreplicate.support_names():
      self._import_support(name)
    for module_name, obj, alias in self._unreplicate.flax_imports:
      RemoveImportsVisitor.remove_unused_import(self.context, module_name, obj, alias)

  # ----- replicated inputs laid out on their site's mesh -----

  def leave_Lambda(self, original_node: cst.Lambda, updated_node: cst.Lambda) -> cst.BaseExpression:
    return cast(cst.BaseExpression, self._unreplicate.apply(original_node, updated_node))

  def leave_Subscript(self, original_node: cst.Subscript,
                      updated_node: cst.Subscript) -> cst.BaseExpression:
    return cast(cst.BaseExpression, self._unreplicate.apply(original_node, updated_node))

  # ----- reporting -----

  def _report(self, node: cst.CSTNode, severity: Severity, message: str) -> None:
    pos = self.get_metadata(PositionProvider, node).start
    self._warn(pos.line, pos.column + 1, severity, message)

  def _warn(self, line: int, column: int, severity: Severity, message: str) -> None:
    self.warn(Finding(line, column, severity, message).format_warning())

  # ----- applying it -----

  def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
    return cast(cst.BaseExpression, self._renames.apply(original_node, updated_node))

  def leave_Attribute(self, original_node: cst.Attribute,
                      updated_node: cst.Attribute) -> cst.BaseExpression:
    return cast(cst.BaseExpression, self._renames.apply(original_node, updated_node))

  def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
    updated_node = self._layout.arguments_moved(original_node, updated_node)
    new = self._layout.replacement(original_node, updated_node)
    if new is None:
      return cast(cst.BaseExpression, self._unreplicate.apply(original_node, updated_node))
    return new

  def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode) -> Any:
    updated = super().on_leave(original_node, updated_node)
    if (isinstance(original_node, cst.SimpleStatementLine)
        and isinstance(updated, cst.SimpleStatementLine) and self._renames.nodes):
      at = self.get_metadata(PositionProvider, original_node)
      updated = self._renames.fitted(at, updated, self._text.indent_of(at.start.line),
                                     self._text.style)
    if (isinstance(original_node, cst.SimpleStatementLine)
        and isinstance(updated, cst.SimpleStatementLine) and updated is not original_node):
      updated = site_layout.pragma_first(updated)
    if (not isinstance(original_node, cst.BaseStatement)
        or not self._meshes.has_statements_before(original_node)):
      return updated
    line = self.get_metadata(PositionProvider, original_node).start.line
    meshes = self._meshes.statements_before(original_node, self._text.style,
                                            len(self._text.indent_of(line)))
    if not meshes or not isinstance(updated, cst.BaseStatement):
      return updated
    # The meshes take the blank lines before the statement (and a notebook's cell
    # boundaries, which must stay above them); its comments stay with it.
    lines = list(cast(cst.SimpleStatementLine, updated).leading_lines)
    pinned = [i for i, line in enumerate(lines)
              if line.comment is not None and imports.PINNED.match(line.comment.value)]
    pin = pinned[-1] + 1 if pinned else 0
    blank = pin
    while blank < len(lines) and lines[blank].comment is None:
      blank += 1
    head, blanks = lines[:pin], lines[pin:blank]  # the cell boundary goes first, once
    kept = blanks if isinstance(updated, (cst.FunctionDef, cst.ClassDef)) else []
    if isinstance(updated, (cst.FunctionDef, cst.ClassDef)) and not kept:
      # at the top of a notebook's cell: the blank lines a def wants after a statement
      kept = [cst.EmptyLine(indent=False)] * (1 if self._text.indent_of(line) else 2)
    if any(isinstance(m, cst.FunctionDef) for m in meshes):
      # A mesh made by a function: two blank lines around each def, as at module level
      # (none above the first at the top of a notebook's cell).
      two = [cst.EmptyLine(indent=False)] * 2
      first = head + (blanks[:-2] + two if blanks or not head else [])
      meshes = [m.with_changes(leading_lines=(first if i == 0 else two)
                               + list(cast(cst.FunctionDef, m).leading_lines))
                for i, m in enumerate(meshes)]
      kept = two
    else:
      meshes[0] = meshes[0].with_changes(leading_lines=head + blanks)
    return cst.FlattenSentinel([*meshes, updated.with_changes(leading_lines=kept + lines[blank:])])

  def leave_FunctionDef(self, original_node: cst.FunctionDef,
                        updated_node: cst.FunctionDef) -> cst.FunctionDef:
    return self._layout.apply_decorators(original_node, updated_node)


def _cache_spelling(module: cst.Module, get_metadata: Any) -> str:
  """How new code names ``functools.cache``: ``cache`` in a file that imports names from
  functools (``from functools import partial``) but not the module, and leaves ``cache``
  free; else ``functools.cache``."""
  scope = get_metadata(ScopeProvider, module, None)
  if scope is None:
    return "functools.cache"
  qualified = {name: {q.name for q in scope.get_qualified_names_for(name)}
               for name in ("functools", "cache") if name in scope}
  if "functools" in qualified.get("functools", ()):
    return "functools.cache"
  if "functools.cache" in qualified.get("cache", ()):
    return "cache"
  froms = any(isinstance(stmt, cst.SimpleStatementLine) and any(
      isinstance(small, cst.ImportFrom) and not small.relative and small.module is not None
      and cst.Module([]).code_for_node(small.module) == "functools" for small in stmt.body)
      for stmt in module.body)
  return "cache" if froms and "cache" not in qualified else "functools.cache"


def _feed(sites: dict[cst.CSTNode, Site], calls: site_calls.SiteCalls, node: cst.CSTNode,
          statement: cst.BaseStatement) -> placed_devices.Feed | None:
  """The calls of the site at ``node`` (held in ``statement``) and the positions it maps
  over axis 0, where every call of it is known (``placed_devices.rows_fed``)."""
  site = sites[node]
  if site.inner is not None or site.options.get("static_broadcasted_argnums") is not None:
    return None
  found = calls.of(node, statement, site.fundef, outermost=site.outermost)
  return (None if found is None
          else (found, placed_devices.axis_zero_positions(site.options.get("in_axes"))))
