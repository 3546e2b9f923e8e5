"""Plans each pmap site's new code: the form a JAX engineer writes by hand where plain
code can express the site, else pmap's own call on the support module.

A decorator site becomes

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
a cached function builds, and is that code in ``on_first_call(lambda: ...)`` (a def's
decorator ``on_first_call(lambda f: ...)``) where importing the module builds it (not in
a lambda). A site whose options plain code cannot express (axes held in variables, ...)
keeps pmap's call, its arguments as written, on ``pmap_via_shard_map`` (the support
module's function with pmap's signature); nested pmaps become
``host_local_io(jax.jit(on_pmap_mesh(...)(f)), ...)``, which builds pmap's mesh on the
first call. A site that cannot be converted exactly is left as it is and
reported as an ERROR with the reason. The new code is laid out by ``site_layout``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import libcst as cst
from libcst.metadata import (Assignment, FunctionScope, PositionProvider,
                              QualifiedNameProvider, QualifiedNameSource, ScopeProvider)

from codemod import (public_api, reaching, removed_apis, site_calls, site_layout, site_meshes,
                     support_module, targets, transform_tables)
from codemod.axes_to_specs import NotLiteral, Unconvertible, read_axes, specs_source
from codemod.bound_targets import AssignedValues
from codemod.edits import Arg, Call, Copied, Value, breakable
from codemod.findings import Severity
from codemod.sites import (PARTIAL_NAMES, PMAP_NAMES, PmapOptions, Site, int_tuple, is_none,
                           qualified)
from codemod.source_text import SourceText

DEFAULT_AXIS = "devices"
# What a pmap handed around as a value becomes (the support module's function).
VALUE_PMAP = "pmap_via_shard_map"
# In_specs longer than this (in characters) are bound to a name before the site, which
# placed_on and shard_map both read, instead of written out twice.
_LONG_SPECS = 40
_TRANSFORM = ("as pmap partially applied (a lambda of pmap on its parameter): the calls, whose "
              "rows legacy pmap chose its devices by, are not in view")
# A mesh device list that counts the rows of the call's arguments, as legacy pmap did.
_BY_ROWS = "pmap_devices("
# Calls that make a new function object each time they run.
_MADE_ANEW = PARTIAL_NAMES | transform_tables.TRANSFORMS
_SPEC_NAMES = frozenset({"jax.sharding.PartitionSpec", "jax.experimental.PartitionSpec",
                         "jax.experimental.pjit.PartitionSpec",
                         "jax._src.partition_spec.PartitionSpec"})
# What only the outermost of nested pmaps may set.
_INNER_FORBIDDEN = ("static_broadcasted_argnums", "donate_argnums", "devices", "backend",
                    "axis_size")
_SHARD_MAP = {"experimental": ("shard_map", "check_rep=False"),
              "jax": ("jax.shard_map", "check_vma=False")}
EXPERIMENTAL_SHARD_MAP = "jax.experimental.shard_map"  # the module, and its function's name
# --target experimental's name for shard_map where the file binds ``shard_map`` to
# something else.
SHARD_MAP_ALIAS = "experimental_shard_map"


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


def spec_name(get_metadata: Callable, sites: list[Site]) -> str:
  """``P`` unless the file binds ``P`` to something other than PartitionSpec."""
  for site in sites:
    scope = get_metadata(ScopeProvider, site.node, None)
    if scope is None:
      continue
    names = {q.name for q in scope.get_qualified_names_for("P")}
    if names - _SPEC_NAMES:
      return "jax.sharding.PartitionSpec"
  return "P"


def shard_map_name(get_metadata: Callable, sites: list[Site], taken: set[str]) -> str:
  """How the sites call jax.experimental's shard_map (``--target experimental``):
  ``shard_map``, imported from its module, unless a site's scope binds that name to
  something else: then through the module where that is what it binds (``from
  jax.experimental import shard_map`` -> ``shard_map.shard_map``), else under
  SHARD_MAP_ALIAS, numbered where the file uses that (``taken``: its identifiers)."""
  function = f"{EXPERIMENTAL_SHARD_MAP}.shard_map"
  for site in sites:
    scope = get_metadata(ScopeProvider, site.node, None)
    names = {q.name for q in scope.get_qualified_names_for("shard_map")} if scope else set()
    if names == {EXPERIMENTAL_SHARD_MAP}:
      return "shard_map.shard_map"
    if names - {function}:
      return next(alias for i in range(1, len(taken) + 2)
                  if (alias := SHARD_MAP_ALIAS + (f"_{i}" if i > 1 else "")) not in taken)
  return "shard_map"


# The support module's functions a converted site may call.
_SITE_SUPPORT_NAMES = ("per_device", "placed_on", "pmap_devices", "on_first_call", VALUE_PMAP)


def unnamed(site: Site) -> bool:
  """Whether the site is one pmap whose axis has no name its function could read: it may
  run on a mesh other sites of its body built (``site_meshes.MeshPlan.joinable``)."""
  given = site.options.get("axis_name")
  return site.inner is None and (given is None or is_none(given))


def axis_names(site: Site, quote: str) -> list[str]:
  """The mesh axis names of a site's pmaps, outer first (``devices`` for an unnamed axis)."""
  names = []
  for depth, level in enumerate(site.levels()):
    given = level.options.get("axis_name")
    if given is None or is_none(given):
      name = DEFAULT_AXIS if depth == 0 else f"{DEFAULT_AXIS}_{depth}"
      names.append(f"{quote}{name}{quote}")
    else:
      names.append(_code(given))
  if len(set(names)) != len(names):
    raise Unconvertible(f"the nested pmaps share an axis name ({', '.join(names)})")
  return names


class SiteForms:
  """Plans the new code of one file's pmap sites (``convert``, a site at a time) into
  ``layout``, their meshes into ``meshes``; what the sites need of the support module
  gathers in ``support_names`` and ``support_flags``; ``calls`` are every call of the
  module, from the pipeline's one analysis walk."""

  def __init__(self, *, module: cst.Module, get_metadata: Callable, text: SourceText,
               layout: site_layout.SiteLayout, meshes: site_meshes.MeshPlan,
               renames: removed_apis.Renames, choice: targets.Choice, spec: str,
               shard_map: str,
               report: Callable[[cst.CSTNode, Severity, str], None],
               library_module: str | None, imported_before_jax_starts: bool,
               calls: site_calls.SiteCalls) -> None:
    self.get_metadata = get_metadata
    self._module = module
    self._text = text
    self._layout = layout
    self._meshes = meshes
    self._renames = renames  # a site whose call only changes pmap's name
    self._choice = choice
    self._spec_name = spec
    self._shard_map = shard_map  # how --target experimental calls it (shard_map_name)
    self._report = report
    self._library_module = library_module  # the dotted name of a public library module
    # A module-level mesh then waits for the site's first call (see convert_pmap).
    self._imported_before_jax_starts = imported_before_jax_starts
    self.converted = 0
    self.support_names: list[str] = []
    self.support_flags: set[str] = set()  # support_module.FEATURES the sites need
    # sites in the plain form -> (their mesh, the source of its devices, its axes)
    self._plain: dict[cst.CSTNode, tuple[str, str, str]] = {}
    # sites given to pmap_via_shard_map, with why (for the report)
    self._via: dict[cst.CSTNode, str] = {}
    self._calls = calls  # how the file calls each site
    self._public = public_api.PublicApi(module, get_metadata)
    # the value each name of a body is bound to (``AssignedValues``), read once per body
    self._values: dict[cst.CSTNode, dict[cst.CSTNode, cst.BaseExpression]] = {}

  def _uses(self, names: list[str]) -> None:
    self.support_names += [name for name in names if name not in self.support_names]

  def _report_public(self, site: Site) -> None:
    """A site in a library's public API changes it for every caller: said at the site."""
    if self._library_module is None:
      return
    line = self.get_metadata(PositionProvider, site.node).start.line
    name = self._public.holder(line)
    if name is not None:
      self._report(site.node, Severity.WARNING,
                   f"{self._library_module}.{name} is public API of a library, so this "
                   "rewrite changes it for every caller: a result of the site it hands on is "
                   "now an array on a NamedSharding mesh, not a PmapSharding one (the same "
                   "values; a caller's own x[0] on it gathers across devices and may read "
                   "-0.0 as 0.0): say so in the release notes")

  def convert(self, site: Site) -> None:
    """Plans the site's new code, or reports why it stays (``site.error``)."""
    if site.error is None:
      try:
        self._build(site)
      except Unconvertible as e:
        site.error = str(e)
    if site.error is not None:
      self._report(site.node, Severity.ERROR, f"pmap left unchanged: {site.error}")
      return
    self.converted += 1
    self._report_public(site)
    names = ", ".join(self._axis_names(site))
    plain = self._plain.get(site.node)
    if site.node in self._via:
      self._report(site.node, Severity.INFO,
                   f"pmap converted to {VALUE_PMAP} (support module) with the same arguments: "
                   f"pmap's signature over jax.jit and shard_map, {self._via[site.node]}")
    elif plain is None:
      why = ""
      if self._meshes.at_module_level(site.node) and self._imported_before_jax_starts:
        why = ("; at module level in a library module or a program that calls "
               "jax.distributed.initialize: its mesh is built on the first call, not when "
               "the module is imported")
      self._report(site.node, Severity.INFO,
                   f"pmap converted to jax.jit(shard_map) over mesh axes {names}{why}")
    else:
      mesh, devices, names = plain
      rows = ""
      placed = self._meshes.devices_of(site.node)[1]
      if placed is not None:
        rows = (f" (as many devices as {placed.how}, line {placed.line}: legacy pmap "
                "mapped as many as they have rows)")
      elif devices.startswith(_BY_ROWS):
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
    enclosing function makes on each call (a def, lambda, partial or JAX transform, such
    as ``jax.vmap(f)``, there): legacy pmap compiled such a function again on each call
    too."""
    if not isinstance(fun, cst.Name):
      return False
    reach = reaching.reaching(self._module, self.get_metadata, fun)
    if reach is None or reach.outside or not reach.bindings:
      return False
    values: dict[cst.CSTNode, cst.BaseExpression] = {}
    scope.node.visit(AssignedValues(values))
    return all(isinstance(b, cst.FunctionDef) or isinstance(values.get(b), cst.Lambda)
               or (isinstance(value := values.get(b), cst.Call)
                   and bool(qualified(self.get_metadata, value.func) & _MADE_ANEW))
               for b in reach.bindings)

  def _axis_names(self, site: Site) -> list[str]:
    return axis_names(site, self._text.style.quote)

  def _build(self, site: Site) -> None:
    taken = support_module.taken(self.get_metadata, site.node, _SITE_SUPPORT_NAMES)
    if taken:
      raise Unconvertible(f"the file binds {', '.join(taken)}, which the converted site "
                          "would call from the support module: rename "
                          f"{'it' if len(taken) == 1 else 'them'}, then rerun")
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
    if len(levels) == 1 and devices is None and self._is_pmap_transform(site):
      # Its calls, and so the rows legacy pmap chose its devices by, are not in view:
      # pmap_via_shard_map chooses by them too.
      self._build_via(site, indent, partial, _TRANSFORM)
      return
    assert in_specs is not None and out_specs is not None  # nested: literal or reported
    shard_map, check = self._shard_map_call()
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
    io_kw += [Arg(kw.value) for kw in mesh_kw
              if _keyword(kw) in ("axes", "static_argnums", "devices")]

    if len(levels) == 1:
      assert static_nums is not None  # else built by _build_via above
      # A module-level site of a library module, or of a program that calls
      # jax.distributed.initialize, must not ask JAX for its devices at import.
      lazy = self._meshes.at_module_level(site.node) and self._imported_before_jax_starts
      if devices is None and not lazy:
        devices = self._devices_of_rows(site, static_nums)
      joined = (self._meshes.joinable(site.node) if devices is None and not lazy
                and unnamed(site) else None)
      if joined is not None and list(joined) != names:
        # No name of its own to keep: it runs on the body's mesh, whose inputs and
        # outputs its own would otherwise lay out again under another axis name.
        names = list(joined)
        in_specs = self._specs(levels, names, "in_axes")
        out_specs = self._specs(levels, names, "out_axes")
        assert in_specs is not None and out_specs is not None  # literal, as with its own
        in_arg = roles["in_axes"] = roles["axis_name"] = Arg(breakable(f"in_specs={in_specs}"))
        out_arg = roles["out_axes"] = Arg(breakable(f"out_specs={out_specs}"))
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
      fallback = self._layout.attach_comments(
          site, roles, jit_arg if jit_kw else None,
          jit_decorator if isinstance(jit_decorator, Call) else None)
      self._layout.decorator_site(site, list(reversed(decorators)), fallback, indent)
    # Nested pmaps (axes known only at run time are reported there, see _specs).
    self._uses(["on_pmap_mesh", "host_local_io"])

  def _shard_map_call(self) -> tuple[str, str]:
    """(shard_map as the sites call it, its keyword turning the replication check off)."""
    shard_map, check = _SHARD_MAP[self._choice.target]
    return (self._shard_map if self._choice.target == "experimental" else shard_map), check

  def _is_pmap_transform(self, site: Site) -> bool:
    """Whether the site is a lambda's whole body mapping the lambda's parameter,
    ``lambda f: jax.pmap(f, "i")``: pmap partially applied, as ``partial(jax.pmap, ...)``."""
    fun = site.fun
    if site.fundef is not None or not isinstance(fun, cst.Name):
      return False
    scope = self.get_metadata(ScopeProvider, fun, None)
    if not (isinstance(scope, FunctionScope) and isinstance(scope.node, cst.Lambda)
            and scope.node.body is site.node):
      return False
    bound = list(scope[fun.value])
    return bool(bound) and all(isinstance(a, Assignment) and a.scope is scope
                               and isinstance(a.node, cst.Param) for a in bound)

  def _build_via(self, site: Site, indent: int, partial: str, why: str = "") -> None:
    """``pmap_via_shard_map(f, <pmap's arguments as written>)``, or the decorator
    ``partial(pmap_via_shard_map, ...)``: pmap's own call on a function of the support
    module with pmap's signature, each argument (and its comments) copied."""
    roles = {name: Arg(self._layout.copied(value, f"{name}="))
             for name, value in site.options.values.items() if name != "fun"}
    ref = self._pmap_named_in(site)
    if ref is not None:
      # Only the name changes: the call, its layout and its comments stay as written.
      line = self.get_metadata(PositionProvider, ref).start.line
      self._renames.replace(ref, cst.Name(VALUE_PMAP), line)
    elif site.options.starred:
      raise Unconvertible(f"pmap's arguments are passed with * or **, so only its name can "
                          f"change, and {VALUE_PMAP} would take the line over "
                          f"{self._text.style.width} columns")
    elif site.fundef is None:
      assert site.fun is not None  # a call site without a function is reported, not built
      fun_arg = Arg(self._layout.copied(site.fun))
      call = Call(VALUE_PMAP, (fun_arg, *roles.values()))
      self._layout.call_site(site, roles, fun_arg, call)
    else:
      decorator = Call(partial, (Arg(VALUE_PMAP), *roles.values()))
      fallback = self._layout.attach_comments(site, roles, None, decorator)
      self._layout.decorator_site(site, [decorator], fallback, indent)
    self._via[site.node] = why or "for options known only at run time"
    self._uses([VALUE_PMAP])
    static = site.options.get("static_broadcasted_argnums")
    self.support_flags |= via_flags(self._choice, site.options.starred or (
        static is not None and not is_none(static)))

  def _pmap_named_in(self, site: Site) -> cst.CSTNode | None:
    """The expression naming pmap in the site's call (``jax.pmap(f, ...)``,
    ``partial(jax.pmap, ...)``), if renaming it keeps its line within the file's limit."""
    node = site.node.decorator if isinstance(site.node, cst.Decorator) else site.node
    while isinstance(node, cst.Call):
      for ref in (node.func, *[arg.value for arg in node.args[:1]]):
        if isinstance(ref, (cst.Name, cst.Attribute)) and qualified(
            self.get_metadata, ref) & PMAP_NAMES:
          pos = self.get_metadata(PositionProvider, ref).start
          grown = len(self._text.line(pos.line)) - len(_code(ref)) + len(VALUE_PMAP)
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

  def _devices_of_rows(self, site: Site, static: tuple[int, ...]) -> str | None:
    """For a site called where it is made on names (``pmap(f)(x, y)``), the devices
    legacy pmap mapped that call over, as the mesh's device list: ``pmap_devices(x, y)``,
    as many of ``jax.devices()`` as the arguments have rows along their mapped axes (a
    ``static`` argument maps none). None where the arguments are not names that hold the
    same value where the mesh is built (the mesh then spans ``jax.devices()``, and the
    report says so)."""
    call = self._meshes.caller(site.node)
    if call is None or not call.args:
      return None
    for arg in call.args:
      if (arg.keyword is not None or arg.star or not isinstance(arg.value, cst.Name)
          or not self._meshes.hoistable(site.node, arg.value, mutable=False, own=True)):
        return None
    in_axes = site.options.get("in_axes")
    every = in_axes is None or (isinstance(in_axes, cst.Integer) and in_axes.value == "0")
    if static and not every:
      return None
    if static:  # axis 0 for each argument but the static ones
      listed = ["None" if i in static else "0" for i in range(len(call.args))]
      axes = f", in_axes=({', '.join(listed)}{',' if len(listed) == 1 else ''})"
    else:
      axes = "" if every else f", in_axes={_code(in_axes)}"
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
    lazy site that importing the module builds is that code in ``on_first_call(lambda:
    ...)`` (a def's decorator ``on_first_call(lambda f: ...)``): nothing asks JAX for its
    devices before the site's first call."""
    in_specs, static = placement
    options = site.options
    given = options.get("axis_name")
    literal = (given is None or is_none(given) or isinstance(given, cst.SimpleString)
               or self._module_constant(given))
    own = devices is not None and devices.startswith(_BY_ROWS)  # the rows of its call
    mesh = self._meshes.mesh_for(site.node, names, literal, devices, lazy, own)
    if literal and len(in_specs) > _LONG_SPECS:  # placed_on and shard_map read one tuple
      in_specs = self._meshes.specs_name(site.node, in_specs,
                                         site.fundef.name.value if site.fundef else "")
      in_arg.value = breakable(f"in_specs={in_specs}")
    # Comments on devices= / backend= go with the mesh statement, which says them now.
    chosen = [roles.setdefault(name, Arg("")) for name in ("devices", "backend", "axis_size")
              if devices is not None and options.get(name) is not None]
    self._plain[site.node] = (mesh, self._meshes.devices_of(site.node)[0], ", ".join(names))
    shard_map, check = self._shard_map_call()
    axes_kw = [self._layout.copied(value, f"{name}=") for name in ("in_axes", "out_axes")
               if (value := options.get(name)) is not None
               and not (isinstance(value, cst.Integer) and value.value == "0")]
    made = f"{mesh}()" if lazy else mesh
    first_call = lazy and self._meshes.built_at_import(site.node)
    # The lazy form: a call site is on_first_call(lambda: <the site>), a def is decorated
    # with on_first_call(lambda f: <the site of f>).
    lambda_ = ("" if not first_call else "lambda: " if site.fundef is None else "lambda f: ")
    place = Call(f"{lambda_}placed_on", (
        made, breakable(in_specs),
        *([f"static_argnums={_tuple_source(static)}"] if static else [])))
    mesh_kw = f"mesh={made}"
    pos = self.get_metadata(PositionProvider, site.node).start
    indent = len(self._text.indent_of(pos.line))
    if first_call and site.fundef is not None:
      jit = Call("jax.jit", (Call(shard_map, (Call("per_device", ("f", *axes_kw)), mesh_kw, in_arg,
                                               out_arg, check)), *jit_kw))
      build = Call("on_first_call", (Call(place, (jit,)),))
      fallback = self._layout.attach_comments(site, roles, None, None)
      self._layout.decorator_site(site, [build], fallback, indent, chosen)
    elif site.fundef is None:
      fun = site.fun
      assert fun is not None  # a call site without a function is reported, not built
      fun_arg = Arg(Call("per_device", (self._layout.copied(fun), *axes_kw)))
      smap = Call(shard_map, (fun_arg, mesh_kw, in_arg, out_arg, check))
      jitted = Call("jax.jit", (smap, *jit_kw))
      made_site = Call(place, (jitted,))
      self._layout.call_site(site, roles, fun_arg, Call("on_first_call", (made_site,))
                             if first_call else made_site, chosen)
    else:
      jit_arg = Arg("jax.jit")
      jit_decorator: Call | str = Call(partial, (jit_arg, *jit_kw)) if jit_kw else "jax.jit"
      smap = Call(partial, (shard_map, mesh_kw, in_arg, out_arg, check))
      body: Call | str = Call(partial, ("per_device", *axes_kw)) if axes_kw else "per_device"
      # top to bottom
      decorators: list[Call | str] = [place, jit_decorator, smap, body]
      fallback = self._layout.attach_comments(
          site, roles, jit_arg if jit_kw else None,
          jit_decorator if isinstance(jit_decorator, Call) else None)
      self._layout.decorator_site(site, decorators, fallback, indent, chosen)
    self._meshes.comment(site.node, site_layout.comments_of(chosen))
    keywords = not self._called_by_position(site)  # the cheaper question first
    self.support_flags |= {flag for flag, needed in (
        (support_module.STATIC_ARGUMENTS, bool(static)),
        (support_module.KEYWORD_CALLS, keywords),
        (support_module.KEYWORD_ARGUMENTS, keywords and not self._bound_by_position(site)),
        (support_module.SHARD_MAP_BEFORE_0_7_2, _before_0_7_2(self._choice))) if needed}
    self._uses(["per_device", "placed_on"] + (["on_first_call"] if first_call else [])
               + (["pmap_devices"] if self._plain[site.node][1].startswith(_BY_ROWS) else []))

  def _called_by_position(self, site: Site) -> bool:
    """Whether every call of the site passes its arguments by position (``site_calls``)."""
    statement = self._meshes.statement(site.node)
    return statement is not None and self._calls.by_position(
        site.node, statement, site.fundef, outermost=site.outermost)

  def _bound_by_position(self, site: Site) -> bool:
    """Whether every call of the site's function binds its arguments by position: the
    function is a def or lambda in view (every one the site's name may hold there) that
    takes no keyword-only arguments, no ``**kwargs`` and no defaults, so a keyword call
    names each positional parameter."""
    funs: list[cst.CSTNode | None] = [site.fundef or site.fun]
    if isinstance(site.fun, cst.Name):
      scope = self.get_metadata(ScopeProvider, site.fun, None)
      reach = reaching.reaching(self._module, self.get_metadata, site.fun)
      if reach is None:  # an enclosing scope's name: any def that scope binds it to
        bound = scope[site.fun.value] if scope is not None else ()
        funs = [getattr(a, "node", None) for a in bound]
      elif reach.outside or not reach.bindings:
        return False
      else:
        owner = scope.node if isinstance(scope, FunctionScope) else self._module
        if owner not in self._values:
          self._values[owner] = {}
          owner.visit(AssignedValues(self._values[owner]))
        values = self._values[owner]
        funs = [b if isinstance(b, cst.FunctionDef) else values.get(b)
                for b in reach.bindings]
      funs = funs or [None]
    return all(isinstance(fun, (cst.FunctionDef, cst.Lambda))
               and not fun.params.kwonly_params and fun.params.star_kwarg is None
               and all(p.default is None for p in (*fun.params.posonly_params,
                                                     *fun.params.params))
               for fun in funs)

  def _module_constant(self, node: cst.BaseExpression) -> bool:
    """Whether ``node`` is a name one statement of the module's own body binds (an
    import, or ``NAME = value``) and nothing binds again (no ``global`` rebinding, no
    local of that name where it is read): once the module is loaded it means the same
    wherever the file reads it, as a literal does."""
    if not isinstance(node, cst.Name):
      return False
    scope = self.get_metadata(ScopeProvider, node, None)
    if scope is None:
      return False
    assignments = list(scope[node.value])
    if (len(assignments) != 1 or not isinstance(assignments[0], cst.metadata.Assignment)
        or not isinstance(assignments[0].scope, cst.metadata.GlobalScope)):
      return False
    bound = assignments[0].node
    return any(isinstance(st, cst.SimpleStatementLine) and len(st.body) == 1
               and (st.body[0] is bound or isinstance(st.body[0], cst.Assign)
                    and len(st.body[0].targets) == 1 and st.body[0].targets[0].target is bound)
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
    return specs_source(trees, names, self._spec_name, outputs=what == "out_axes", what=what)

  def _axes(self, options: PmapOptions, name: str):
    node = options.get(name)
    return 0 if node is None else read_axes(node, name)

  def _partial_spelling(self, levels: list[Site]) -> str:
    for level in levels:
      expr = level.node.decorator if isinstance(level.node, cst.Decorator) else None
      if isinstance(expr, cst.Call):
        return _code(expr.func)
    return "functools.partial"


def via_flags(choice: targets.Choice, static: bool) -> set[str]:
  """The support flags a call of pmap_via_shard_map needs beyond those it always has:
  ``static`` where it may be given static_broadcasted_argnums."""
  return {flag for flag, needed in ((support_module.STATIC_ARGUMENTS, static),
                                    (support_module.SHARD_MAP_BEFORE_0_7_2,
                                     _before_0_7_2(choice))) if needed}


def _before_0_7_2(choice: targets.Choice) -> bool:
  return choice.admits_before(targets.SHARD_MAP_KEEPS_OUTPUT_TREES)


def _tuple_source(values: tuple[int, ...]) -> str:
  return f"({values[0]},)" if len(values) == 1 else f"({', '.join(map(str, values))})"


def _keyword(arg: Arg) -> str:
  text = arg.value.code if isinstance(arg.value, Copied) else arg.value
  return text.split("=", 1)[0] if isinstance(text, str) else ""


def _code(node: cst.CSTNode | None) -> str:
  assert node is not None  # callers pass arguments the site was checked to have
  return cst.Module([]).code_for_node(node)
