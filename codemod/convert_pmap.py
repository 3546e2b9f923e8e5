"""Rewrites JAX pmap sites into ``jax.jit`` over ``jax.shard_map`` with equivalent specs.

Sites are found by meaning (``sites.References``, ``site_finder``): ``jax.pmap(f, ...)``
in any spelling, ``partial(jax.pmap, ...)(f)``, and the decorators ``@jax.pmap`` /
``@partial(jax.pmap, ...)``. A decorator site becomes

    @placed_on(mesh, P("i"))
    @functools.partial(jax.jit, donate_argnums=(0,))
    @functools.partial(jax.shard_map, mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                       check_vma=False)
    @per_device

and a call ``placed_on(mesh, P("i"))(jax.jit(jax.shard_map(per_device(f), mesh=mesh,
...)))``: the specs are pmap's in_axes / out_axes, the mesh a statement the file gets
where it builds the pmap (``site_meshes``), and ``per_device`` / ``placed_on`` (from the
support module the converted tree gets once, see ``codemod.support_module``) pmap's view
of the arguments and its placement of them; static_broadcasted_argnums go to both jit
and placed_on, devices / backend / axis_size to the mesh's devices. A module-level site
of a library module (or of a program calling jax.distributed.initialize) runs on a mesh
a cached function builds, and is that code in ``on_first_call(lambda f: ...)`` where
importing the module builds it (not in a lambda). The sites that may run where the file
replaces jax.pmap, and those of a module whose own ``pmap`` the run replaces, are left
(``pmap_patches``). A site whose
options plain code cannot express (axes held in variables, ...) keeps pmap's call, its
arguments as written, on ``pmap_via_shard_map`` (the support module's function with
pmap's signature); nested pmaps become ``host_local_io(jax.jit(on_pmap_mesh(...)(f)),
...)``, which builds pmap's mesh on the first call. A site that cannot be converted
exactly is left as it is and reported as an ERROR with the reason. With ``--target jax``
the names newest JAX removed are rewritten (the ``jax.tree_map`` family,
``device_put_replicated`` / ``device_put_sharded``) or reported. Findings go to the
context's warnings (``self.warn``), one ``line:col SEVERITY message`` each; the site
counts to ``context.scratch``.
"""
from __future__ import annotations

import argparse
import bisect
import os
import re
import tokenize
from collections.abc import Mapping
from typing import Any, cast

import libcst as cst
from libcst.codemod import Codemod, CodemodContext, VisitorBasedCodemodCommand
from libcst.codemod.visitors import RemoveImportsVisitor
from libcst.metadata import (CodeRange, FunctionScope, PositionProvider, QualifiedNameProvider,
                              QualifiedNameSource, ScopeProvider)

from codemod import (imports, matcher_setup, pmap_patches, public_api, reaching,
                     removed_apis, removed_names, site_layout, site_meshes, source_text,
                     support_module, targets, together, unreplicate, unused_imports)
from codemod.edits import Arg, Call, Copied, Value, breakable
from codemod.axes_to_specs import NotLiteral, Unconvertible, read_axes, specs_source
from codemod.findings import SITES_KEY, Finding, Severity
from codemod.site_finder import Found, SiteFinder
from codemod.sites import (PARTIAL_NAMES, PMAP_NAMES, PmapOptions, References, Site, int_tuple,
                           is_none, qualified)

DEFAULT_AXIS = "devices"
TARGETS = targets.TARGETS
_SPEC_NAMES = frozenset({"jax.sharding.PartitionSpec", "jax.experimental.PartitionSpec",
                         "jax.experimental.pjit.PartitionSpec",
                         "jax._src.partition_spec.PartitionSpec"})
_INITIALIZE = re.compile(r"\bdistributed\.initialize\(|\bfrom jax\.distributed import")
# Comments a checker reads at the first line of the statement it reports on.
_INNER_FORBIDDEN = ("static_broadcasted_argnums", "donate_argnums", "devices", "backend",
                    "axis_size")
_SHARD_MAP = {"experimental": ("shard_map", "check_rep=False"),
              "jax": ("jax.shard_map", "check_vma=False")}


def _forwarded_global_arg_shapes(levels: list[Site]) -> list[cst.BaseExpression]:
  """The ``global_arg_shapes`` values that are names passed through (a wrapper forwarding
  its own parameter, None unless its caller set it): the converted site drops them. A
  value written out is an error legacy pmap raised, so such a site is not converted."""
  forwarded: list[cst.BaseExpression] = []
  for level in levels:
    shapes = level.options.get("global_arg_shapes")
    if shapes is None or is_none(shapes):
      continue
    if not isinstance(shapes, (cst.Name, cst.Attribute)):
      raise Unconvertible("global_arg_shapes is set (legacy pmap rejects it with ValueError)")
    forwarded.append(shapes)
  return forwarded


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
    self._p = "P"
    self._site_lines: list[int] = []
    self._edited_lines: set[int] = set()  # lines holding code the rewrite replaces
    self._module: cst.Module | None = None
    self._text = source_text.SourceText("")
    self._layout = site_layout.SiteLayout(self._text, self._position, lambda _: False)
    self._imports_requested = False
    self._support_names: list[str] = []
    self._support_flags: set[str] = set()  # support_module.FEATURES the sites need
    self._pmap_imports: list[tuple[str, str | None]] = []
    self._pmap_module_imports: list[tuple[str, str | None]] = []
    self._unreplicate = unreplicate.Rewrites()
    self._walked_idioms: cst.CSTVisitor | None = None  # walked with References, for plan()
    self._meshes = site_meshes.MeshPlan(cst.Module([]), self.get_metadata, set())
    # sites in the plain form -> (their mesh, the source of its devices)
    self._plain: dict[cst.CSTNode, tuple[str, str]] = {}
    self._via: set[cst.CSTNode] = set()  # sites given to pmap_via_shard_map
    self._imported_before_jax_starts = False  # see visit_Module
    self._library_module: str | None = None  # the dotted name of a public library module

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
    for ref in found.values:
      self.sites_found += 1
      self._value_use(ref, refs)
    self._p = self._spec_name(node, sites)
    axes = set()
    for site in sites:
      try:
        axes.add(tuple(self._axis_names(site)))
      except Unconvertible:
        pass
    self._meshes = site_meshes.MeshPlan(
        node, self.get_metadata, {t.string for t in self._text.tokens if t.type == tokenize.NAME},
        by_axis=len(axes) > 1)
    # A module-level mesh starts JAX's backend at import: not in a library module (whoever
    # imports it may call jax.distributed.initialize after) nor in a program that calls
    # it. Their module-level sites are made on their first call (on_first_call).
    self._library_module = (public_api.module_name(path) if path and os.path.isfile(path)
                            else None)
    self._imported_before_jax_starts = bool(
        (path and os.path.isfile(path) and (
            support_module.package_of(path) is not None
            or os.path.dirname(os.path.abspath(path)) in self._run_names))
        or _INITIALIZE.search(self._text.text))
    for site in sites:
      if site.absorbed:
        continue
      self.sites_found += 1
      self._convert(site)
    converted = [s for s in sites if not s.absorbed and s.error is None]
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

  def _report_public(self, site: Site) -> None:
    """A site in a library's public API changes it for every caller: said at the site."""
    if self._library_module is None or self._module is None:
      return
    line = self.get_metadata(PositionProvider, site.node).start.line
    name = public_api.holder(self._module, self.get_metadata, line)
    if name is not None:
      self._report(site.node, Severity.WARNING,
                   f"{self._library_module}.{name} is public API of a library, so this "
                   "rewrite changes it for every caller: a result of the site it hands on is "
                   "now an array on a NamedSharding mesh, not a PmapSharding one (the same "
                   "values; a caller's own x[0] on it gathers across devices and may read "
                   "-0.0 as 0.0): say so in the release notes")

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
    self._report_public(site)
    names = ", ".join(self._axis_names(site))
    plain = self._plain.get(site.node)
    if site.node in self._via:
      self._report(site.node, Severity.INFO,
                   f"pmap converted to {_VALUE_PMAP} (support module) with the same arguments: "
                   "pmap's signature over jax.jit and shard_map, for options known only at run "
                   "time")
    elif plain is None:
      why = ""
      if self._meshes.at_module_level(site.node) and self._imported_before_jax_starts:
        why = ("; at module level in a library module or a program that calls "
               "jax.distributed.initialize: its mesh is built on the first call, not when "
               "the module is imported")
      self._report(site.node, Severity.INFO,
                   f"pmap converted to jax.jit(shard_map) over mesh axes {names}{why}")
    else:
      mesh, devices = plain
      rows = ""
      if devices.startswith(_BY_ROWS):
        rows = (" (the devices legacy pmap mapped these arguments over: as many as they "
                "have rows)")
      elif devices.startswith("jax.devices(") and devices.endswith(")"):
        # Legacy pmap chose its devices from the arguments, on every call.
        rows = (f"; legacy pmap mapped over as many devices as the arguments have rows: "
                f"where they can have fewer, build the mesh over {devices}[:rows]")
      self._report(site.node, Severity.INFO,
                   f"pmap converted to jax.jit(shard_map) on {mesh}, a mesh over {devices} "
                   f"with axis {names}" + self._meshes.where(site.node) + rows)
      again = self._evaluated_again(site)
      if (again is not None and isinstance(site.fun, cst.Attribute)
          and not self._module_attribute(site.fun)):
        # A bound method is a new object on each access: legacy pmap compiled it again
        # too; a function held in an attribute is the same object, which it reused.
        self._report(site.node, Severity.WARNING,
                     f"the converted site is built {again}: each time makes a new jax.jit, "
                     f"which traces and compiles again; legacy pmap did too if {_code(site.fun)} "
                     "is a bound method (a new object on each access), but reused its compile "
                     "if it is a function: then build the site once, outside")
      elif again is not None:
        self._report(site.node, Severity.WARNING,
                     f"the converted site is built {again}: each time makes a new jax.jit, "
                     "which traces and compiles again where legacy pmap reused its compile "
                     "of the same function; build it once, outside")
    # pmap_via_shard_map takes global_arg_shapes as legacy pmap did.
    for shapes in [] if site.node in self._via else _forwarded_global_arg_shapes(site.levels()):
      self._report(shapes, Severity.WARNING,
                   f"global_arg_shapes={_code(shapes)} dropped: legacy pmap raised ValueError "
                   "unless it was None, the converted site ignores it")

  def _evaluated_again(self, site: Site) -> str | None:
    """Where a call site is built anew each time it runs: in a loop or a comprehension,
    or called where it is built inside a function (a helper run per step)."""
    # A lambda or partial made there is a new function each time: legacy pmap compiled
    # it again too.
    if site.fundef is not None or not isinstance(site.fun, (cst.Name, cst.Attribute)):
      return None
    again = self._meshes.evaluated_again(site.node)
    if again is not None:
      return again
    end = self.get_metadata(PositionProvider, site.node).end
    called = self._text.line(end.line)[end.column:].lstrip().startswith("(")
    scope = self.get_metadata(ScopeProvider, site.node, None)
    inside = scope is not None and not isinstance(scope, cst.metadata.GlobalScope)
    if not (called and inside) or self._made_per_call(site.fun, scope):
      return None
    return "and called inside a function, on each call of it"

  def _module_attribute(self, node: cst.Attribute) -> bool:
    """Whether ``node`` reads a name of an imported module (``jnp.ones_like``): a function
    there, not a method bound anew on each access."""
    return any(q.source is QualifiedNameSource.IMPORT
               for q in self.get_metadata(QualifiedNameProvider, node, set()))

  def _made_per_call(self, fun: cst.BaseExpression, scope: Any) -> bool:
    """Whether ``fun`` names, wherever it is bound before the site, a function its
    enclosing function makes on each call (a def, lambda or partial there): legacy pmap
    compiled such a function again on each call too."""
    if not isinstance(fun, cst.Name) or self._module is None:
      return False
    reach = reaching.reaching(self._module, self.get_metadata, fun)
    if reach is None or reach.outside or not reach.bindings:
      return False
    values: dict[cst.CSTNode, cst.BaseExpression] = {}
    scope.node.visit(_AssignedValues(values))
    return all(isinstance(b, cst.FunctionDef) or isinstance(values.get(b), cst.Lambda)
               or (isinstance(value := values.get(b), cst.Call)
                   and bool(qualified(self.get_metadata, value.func) & PARTIAL_NAMES))
               for b in reach.bindings)

  def _axis_names(self, site: Site) -> list[str]:
    levels = site.levels()
    names = []
    for depth, level in enumerate(levels):
      given = level.options.get("axis_name")
      if given is None or is_none(given):
        name = DEFAULT_AXIS if depth == 0 else f"{DEFAULT_AXIS}_{depth}"
        names.append(f"{self._text.style.quote}{name}{self._text.style.quote}")
      else:
        names.append(_code(given))
    if len(set(names)) != len(names):
      raise Unconvertible(f"the nested pmaps share an axis name ({', '.join(names)})")
    return names

  def _build(self, site: Site) -> None:
    levels = site.levels()
    outer = levels[0].options
    if any(level.options.starred for level in levels):
      if len(levels) > 1:
        raise Unconvertible("nested pmaps with arguments passed with * or **")
      # Which options they set is known only at run time, as pmap_via_shard_map reads
      # them: only pmap's name changes.
      self._build_via(site, 0, "")
      return
    _forwarded_global_arg_shapes(levels)
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
    static_nums = () if is_none(static) else int_tuple(static, "static_broadcasted_argnums")
    int_tuple(outer.get("donate_argnums"), "donate_argnums")
    extra = {name: outer.get(name) for name in ("axis_size", "devices", "backend")
             if outer.get(name) is not None and not is_none(outer.get(name))}

    partial = self._partial_spelling(levels)
    pos = self.get_metadata(PositionProvider, site.node).start
    indent = len(self._text.indent_of(pos.line))
    plain_mesh, devices = self._mesh_devices(site, extra)
    if len(levels) == 1 and (in_specs is None or out_specs is None or static_nums is None
                             or not plain_mesh):
      # Options known only at run time: pmap's own arguments, to the function that gives
      # pmap's signature over jax.jit and shard_map.
      self._build_via(site, indent, partial)
      return
    assert in_specs is not None and out_specs is not None  # nested: literal or reported
    shard_map, check = _SHARD_MAP[self.target]
    # Each generated argument is an Arg, so the comments around the pmap argument it
    # replaces can be attached to it (``_attach_comments``).
    roles: dict[str, Arg] = {}
    in_arg = roles["in_axes"] = roles["axis_name"] = Arg(breakable(f"in_specs={in_specs}"))
    out_arg = roles["out_axes"] = Arg(breakable(f"out_specs={out_specs}"))
    mesh_kw: list[Arg] = [Arg("drop_device_axis=True")]
    axes = f"({names[0]},)" if len(names) == 1 else f"({', '.join(names)})"
    if len(names) > 1 or "axis_size" in extra:
      mesh_kw.append(Arg(f"axes={axes}"))
    jit_kw: list[Arg] = []
    if static is not None:
      mesh_kw.append(Arg(self._layout.copied(static, "static_argnums=")))
      jit_kw.append(roles.setdefault("static_broadcasted_argnums",
                                     Arg(self._layout.copied(static, "static_argnums="))))
    for name, value in extra.items():
      assert value is not None  # extra holds the options the site sets
      mesh_kw.append(roles.setdefault(name, Arg(self._layout.copied(value, f"{name}="))))
    donate = outer.get("donate_argnums")
    if donate is not None:
      jit_kw.append(roles.setdefault("donate_argnums",
                                     Arg(self._layout.copied(donate, "donate_argnums="))))
    io_kw: list[Arg | Value] = [breakable(f"in_specs={in_specs}"),
                                breakable(f"out_specs={out_specs}")]
    # pmap spanned every process's devices: each process passes host-local arrays.
    mesh_kw.append(Arg("across_hosts=True"))
    io_kw += [Arg(kw.value) for kw in mesh_kw if _keyword(kw) in ("axes", "static_argnums", "devices")]

    if len(levels) == 1:
      assert static_nums is not None  # else built by _build_via above
      # A module-level site of a library module, or of a program that calls
      # jax.distributed.initialize, must not ask JAX for its devices at import.
      lazy = self._meshes.at_module_level(site.node) and self._imported_before_jax_starts
      if devices is None and not static_nums and not lazy:
        devices = self._devices_of_rows(site)
      self._build_plain(site, names, roles, (in_specs, static_nums), in_arg, out_arg, jit_kw,
                        partial, devices, lazy)
      return
    smap = Call(partial, (shard_map, in_arg, out_arg, check))
    on_mesh = Call("on_pmap_mesh", (smap, *mesh_kw))
    if site.fundef is None:
      fun = levels[-1].fun
      assert fun is not None  # a call site without a function is reported, not built
      fun_arg = Arg(Call(on_mesh, (self._layout.copied(fun),)))
      jit = Call("jax.jit", (fun_arg, *jit_kw))
      self._layout.call_site(site, roles, fun_arg, Call("host_local_io", (jit, *io_kw)))
    else:
      jit_arg = Arg("jax.jit")  # takes the comments on pmap in partial(pmap, ...)
      jit_decorator: Call | str = Call(partial, (jit_arg, *jit_kw)) if jit_kw else "jax.jit"
      decorators: list[Call | str] = [on_mesh, jit_decorator]
      decorators.append(Call(partial, ("host_local_io", *io_kw)))
      fallback = self._layout.attach_comments(site, roles, jit_arg if jit_kw else None,
                                       jit_decorator if isinstance(jit_decorator, Call) else None)
      self._layout.decorator_site(site, list(reversed(decorators)), fallback, indent)
    # Nested pmaps (axes known only at run time are reported there, see _specs).
    self._add_imports(partial, ["on_pmap_mesh", "host_local_io"])

  def _build_via(self, site: Site, indent: int, partial: str) -> None:
    """``pmap_via_shard_map(f, <pmap's arguments as written>)``, or the decorator
    ``partial(pmap_via_shard_map, ...)``: pmap's own call on a function of the support
    module with pmap's signature, each argument (and its comments) copied."""
    roles = {name: Arg(self._layout.copied(value, f"{name}="))
             for name, value in site.options.values.items() if name != "fun"}
    ref = self._pmap_named_in(site)
    if ref is not None:
      # Only the name changes: the call, its layout and its comments stay as written.
      self._renames.replace(ref, cst.Name(_VALUE_PMAP), self._start_line(ref))
    elif site.options.starred:
      raise Unconvertible(f"pmap's arguments are passed with * or **, so only its name can "
                          f"change, and {_VALUE_PMAP} would take the line over "
                          f"{self._text.style.width} columns")
    elif site.fundef is None:
      assert site.fun is not None  # a call site without a function is reported, not built
      fun_arg = Arg(self._layout.copied(site.fun))
      self._layout.call_site(site, roles, fun_arg, Call(_VALUE_PMAP, (fun_arg, *roles.values())))
    else:
      decorator = Call(partial, (Arg(_VALUE_PMAP), *roles.values()))
      fallback = self._layout.attach_comments(site, roles, None, decorator)
      self._layout.decorator_site(site, [decorator], fallback, indent)
    self._via.add(site.node)
    self._add_imports(partial, [_VALUE_PMAP])

  def _pmap_named_in(self, site: Site) -> cst.CSTNode | None:
    """The expression naming pmap in the site's call (``jax.pmap(f, ...)``,
    ``partial(jax.pmap, ...)``), if renaming it keeps its line within the file's limit."""
    node = site.node.decorator if isinstance(site.node, cst.Decorator) else site.node
    while isinstance(node, cst.Call):
      for ref in (node.func, *[arg.value for arg in node.args[:1]]):
        if isinstance(ref, (cst.Name, cst.Attribute)) and qualified(
            self.get_metadata, ref) & PMAP_NAMES:
          pos = self.get_metadata(PositionProvider, ref).start
          grown = len(self._text.line(pos.line)) - len(_code(ref)) + len(_VALUE_PMAP)
          return ref if grown <= self._text.style.width else None
      node = node.func
    return None

  def _mesh_devices(self, site: Site, extra: dict[str, cst.BaseExpression | None]
                    ) -> tuple[bool, str | None]:
    """(whether a mesh statement can say which devices the site maps over, the source of
    that device list where pmap's ``devices=``, ``backend=`` or ``axis_size=`` chose it,
    else None for ``jax.devices()``). It cannot for ``devices`` with ``axis_size``, or for
    a value (or an axis name that is not a literal) that spans lines or means something
    else before the site's statement."""
    axis = site.options.get("axis_name")
    if (axis is not None and not is_none(axis) and not isinstance(axis, cst.SimpleString)
        and not self._meshes.hoistable(site.node, axis, mutable=False)):
      return False, None
    if "devices" in extra and "axis_size" in extra:
      return False, None
    for name, value in extra.items():
      assert value is not None  # extra holds the options the site sets
      pos = self.get_metadata(PositionProvider, value)
      if (pos.start.line != pos.end.line
          or not self._meshes.hoistable(site.node, value, mutable=name == "devices")):
        return False, None
    if "devices" in extra:
      return True, _code(extra["devices"])
    pool = f"jax.devices({_code(extra['backend'])})" if "backend" in extra else None
    if "axis_size" in extra:  # pmap took the first axis_size devices
      pool = f"{pool or 'jax.devices()'}[:{_code(extra['axis_size'])}]"
    return True, pool

  def _devices_of_rows(self, site: Site) -> str | None:
    """For a site called where it is made on names (``pmap(f)(x, y)``), the devices
    legacy pmap mapped that call over, as the mesh's device list: ``pmap_devices(x, y)``,
    as many of ``jax.devices()`` as the arguments have rows along their mapped axes.
    None where the arguments are not names that hold the same value where the mesh is
    built (the mesh then spans ``jax.devices()``, and the report says so)."""
    call = self._meshes.caller(site.node)
    if call is None or not call.args:
      return None
    for arg in call.args:
      if (arg.keyword is not None or arg.star or not isinstance(arg.value, cst.Name)
          or not self._meshes.hoistable(site.node, arg.value, mutable=False)):
        return None
    in_axes = site.options.get("in_axes")
    axes = ("" if in_axes is None or (isinstance(in_axes, cst.Integer) and in_axes.value == "0")
            else f", in_axes={_code(in_axes)}")
    return f"{_BY_ROWS}{', '.join(_code(a.value) for a in call.args)}{axes})"

  def _build_plain(self, site: Site, names: list[str], roles: dict[str, Arg],
                   placement: tuple[str, tuple[int, ...]], in_arg: Arg, out_arg: Arg,
                   jit_kw: list[Arg], partial: str, devices: str | None,
                   lazy: bool = False) -> None:
    """The site as a JAX engineer writes it: ``jax.jit`` over ``jax.shard_map`` on a mesh
    the file builds (``site_meshes``), the function through ``per_device`` (pmap's view
    of its arguments), and ``placed_on`` putting the arguments on the mesh first
    (``placement``: the in_specs, and pmap's static_broadcasted_argnums, which it holds
    as they are through shard_map). A ``lazy`` site's mesh is a cached function, and a
    lazy site that importing the module builds is that code in
    ``on_first_call(lambda f: ...)``: nothing asks JAX for its devices before the site's
    first call."""
    in_specs, static = placement
    options = site.options
    given = options.get("axis_name")
    literal = (given is None or is_none(given) or isinstance(given, cst.SimpleString)
               or self._module_constant(given))
    mesh = self._meshes.mesh_for(site.node, names, literal, devices, lazy)
    # Comments on devices= / backend= go with the mesh statement, which says them now.
    chosen = [roles.setdefault(name, Arg("")) for name in ("devices", "backend", "axis_size")
              if devices is not None and options.get(name) is not None]
    self._plain[site.node] = (mesh, devices or "jax.devices()")
    shard_map, check = _SHARD_MAP[self.target]
    axes_kw = [self._layout.copied(value, f"{name}=") for name in ("in_axes", "out_axes")
               if (value := options.get(name)) is not None
               and not (isinstance(value, cst.Integer) and value.value == "0")]
    made = f"{mesh}()" if lazy else mesh
    first_call = lazy and self._meshes.built_at_import(site.node)
    place = Call("lambda f: placed_on" if first_call else "placed_on", (
        made, breakable(in_specs),
        *([f"static_argnums={_tuple_source(static)}"] if static else [])))
    mesh_kw = f"mesh={made}"
    pos = self.get_metadata(PositionProvider, site.node).start
    indent = len(self._text.indent_of(pos.line))
    if first_call:
      jit = Call("jax.jit", (Call(shard_map, (Call("per_device", ("f", *axes_kw)), mesh_kw, in_arg,
                                               out_arg, check)), *jit_kw))
      build = Call("on_first_call", (Call(place, (jit,)),))
      if site.fundef is None:
        assert site.fun is not None  # a call site without a function is reported, not built
        fun_arg = Arg(self._layout.copied(site.fun))
        self._layout.call_site(site, roles, fun_arg, Call(build, (fun_arg,)), chosen)
      else:
        fallback = self._layout.attach_comments(site, roles, None, None)
        self._layout.decorator_site(site, [build], fallback, indent, chosen)
    elif site.fundef is None:
      fun = site.fun
      assert fun is not None  # a call site without a function is reported, not built
      fun_arg = Arg(Call("per_device", (self._layout.copied(fun), *axes_kw)))
      smap = Call(shard_map, (fun_arg, mesh_kw, in_arg, out_arg, check))
      self._layout.call_site(site, roles, fun_arg, Call(place, (Call("jax.jit", (smap, *jit_kw)),)),
                           chosen)
    else:
      jit_arg = Arg("jax.jit")
      jit_decorator: Call | str = Call(partial, (jit_arg, *jit_kw)) if jit_kw else "jax.jit"
      smap = Call(partial, (shard_map, mesh_kw, in_arg, out_arg, check))
      body: Call | str = Call(partial, ("per_device", *axes_kw)) if axes_kw else "per_device"
      # top to bottom
      decorators: list[Call | str] = [place, jit_decorator, smap, body]
      fallback = self._layout.attach_comments(site, roles, jit_arg if jit_kw else None,
                                       jit_decorator if isinstance(jit_decorator, Call) else None)
      self._layout.decorator_site(site, decorators, fallback, indent, chosen)
    self._meshes.comment(site.node, site_layout.comments_of(chosen))
    self._support_flags |= {flag for flag, needed in (
        (support_module.STATIC_ARGUMENTS, bool(static)),
        (support_module.KEYWORD_ARGUMENTS, not self._bound_by_position(site)),
        (support_module.SHARD_MAP_BEFORE_0_7_2,
         self._choice.admits_before(targets.SHARD_MAP_KEEPS_OUTPUT_TREES))) if needed}
    self._add_imports(partial, ["per_device", "placed_on"] + (["on_first_call"] if first_call else [])
                      + (["pmap_devices"] if (devices or "").startswith(_BY_ROWS) else []))

  def _bound_by_position(self, site: Site) -> bool:
    """Whether every call of the site's function binds its arguments by position: the
    function is a def or lambda in view (every one the site's name may hold there) that
    takes no keyword-only arguments, no ``**kwargs`` and no defaults, so a keyword call
    names each positional parameter."""
    funs: list[cst.CSTNode | None] = [site.fundef or site.fun]
    if isinstance(site.fun, cst.Name) and self._module is not None:
      scope = self.get_metadata(ScopeProvider, site.fun, None)
      reach = reaching.reaching(self._module, self.get_metadata, site.fun)
      if reach is None:  # an enclosing scope's name: any def that scope binds it to
        bound = scope[site.fun.value] if scope is not None else ()
        funs = [getattr(a, "node", None) for a in bound]
      elif reach.outside or not reach.bindings:
        return False
      else:
        values: dict[cst.CSTNode, cst.BaseExpression] = {}
        owner = scope.node if isinstance(scope, FunctionScope) else self._module
        owner.visit(_AssignedValues(values))
        funs = [b if isinstance(b, cst.FunctionDef) else values.get(b)
                for b in reach.bindings]
      funs = funs or [None]
    return all(isinstance(fun, (cst.FunctionDef, cst.Lambda))
               and not fun.params.kwonly_params and fun.params.star_kwarg is None
               and all(p.default is None for p in (*fun.params.posonly_params,
                                                     *fun.params.params))
               for fun in funs)

  def _module_constant(self, node: cst.BaseExpression) -> bool:
    """Whether ``node`` is a name the module binds once, to a string literal, and nothing
    binds again (no ``global`` rebinding, no local of that name where it is read): it
    means the same wherever the file reads it, as a literal does."""
    if not isinstance(node, cst.Name):
      return False
    scope = self.get_metadata(ScopeProvider, node, None)
    if scope is None:
      return False
    assignments = list(scope[node.value])
    if (len(assignments) != 1 or not isinstance(assignments[0], cst.metadata.Assignment)
        or not isinstance(assignments[0].scope, cst.metadata.GlobalScope)
        or self._module is None):
      return False
    bound = assignments[0].node
    return any(isinstance(st, cst.SimpleStatementLine) and len(st.body) == 1
               and isinstance(st.body[0], cst.Assign) and len(st.body[0].targets) == 1
               and st.body[0].targets[0].target is bound
               and isinstance(st.body[0].value, cst.SimpleString)
               for st in self._module.body)

  def _specs(self, levels: list[Site], names: list[str], what: str) -> str | None:
    """Spec source for in_axes / out_axes; None for a single pmap's axes that are known
    only at run time (nested pmaps' are reported)."""
    try:
      trees = [self._axes(level.options, what) for level in levels]
    except NotLiteral:
      if len(levels) > 1:
        raise
      return None
    return specs_source(trees, names, self._p, outputs=what == "out_axes", what=what)

  def _axes(self, options: PmapOptions, name: str):
    node = options.get(name)
    return 0 if node is None else read_axes(node, name)

  def _partial_spelling(self, levels: list[Site]) -> str:
    for level in levels:
      expr = level.node.decorator if isinstance(level.node, cst.Decorator) else None
      if isinstance(expr, cst.Call):
        return _code(expr.func)
    return "functools.partial"

  def _import_support(self, name: str) -> None:
    if name not in self._support_names:
      self._support_names.append(name)

  def _add_imports(self, partial: str, support_names: list[str]) -> None:
    del partial  # the imports follow from the code written (see leave_Module)
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
                  imports.Wanted("jax.sharding", "PartitionSpec", "P"),
                  imports.Wanted("jax.experimental.shard_map", "shard_map")]
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
    path = self.context.filename
    style = self._text.style
    return imports.add(updated_node, wanted, style.width, style=style.imports,
                       here=os.path.dirname(os.path.abspath(path)) if path else None)

  # ----- names newest JAX removed (--target jax) -----

  def _plan_renames(self, refs: References) -> None:
    if self.target != "jax":
      return
    known = len(self._renames.findings)
    removed_apis.plan(refs, lambda node: self.get_metadata(PositionProvider, node),
                      self.support_module, into=self._renames)
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
    self.sites_converted += 1
    self._renames.replace(ref, cst.Name(_VALUE_PMAP), self._start_line(ref))
    self._add_imports("", [_VALUE_PMAP])
    self._report(ref, Severity.INFO,
                 f"pmap used as a value here rewritten to {_VALUE_PMAP} (support module): "
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


def _tuple_source(values: tuple[int, ...]) -> str:
  return f"({values[0]},)" if len(values) == 1 else f"({', '.join(map(str, values))})"


def _keyword(arg: Arg) -> str:
  text = arg.value.code if isinstance(arg.value, Copied) else arg.value
  return text.split("=", 1)[0] if isinstance(text, str) else ""


# What a pmap handed around as a value becomes (the support module's function).
_VALUE_PMAP = "pmap_via_shard_map"
# A mesh device list that counts the rows of the call's arguments, as legacy pmap did.
_BY_ROWS = "pmap_devices("


def _code(node: cst.CSTNode | None) -> str:
  assert node is not None  # callers pass arguments the site was checked to have
  return cst.Module([]).code_for_node(node)


class _AssignedValues(cst.CSTVisitor):
  """Each name a plain ``name = value`` binds in a body, with its value (nested function
  and class bodies are other scopes)."""

  def __init__(self, values: dict[cst.CSTNode, cst.BaseExpression]):
    self.values = values
    self.depth = 0

  def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
    self.depth += 1
    return self.depth == 1

  def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
    self.depth -= 1

  def visit_ClassDef(self, node: cst.ClassDef) -> bool:
    return False

  def visit_Assign(self, node: cst.Assign) -> None:
    for target in node.targets:
      if isinstance(target.target, cst.Name):
        self.values[target.target] = node.value
