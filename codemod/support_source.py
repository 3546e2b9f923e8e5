import collections
import functools
import inspect
import math

import jax
import numpy as np

PartitionSpec = jax.sharding.PartitionSpec

# A repository's copy keeps the code under each flag only where its sites need
# it (codemod/support_module.py cuts it): pmap's static_broadcasted_argnums;
# calls that may pass keywords; keyword arguments no position takes; shard_map
# before jax 0.7.2; pmap's options read at run time (pmap_via_shard_map),
# checked as legacy pmap did.
STATIC_ARGUMENTS = KEYWORD_CALLS = KEYWORD_ARGUMENTS = True
SHARD_MAP_BEFORE_0_7_2 = RUN_TIME_OPTIONS = True


@jax.tree_util.register_static
class _Static(tuple):
  """(value,) of pmap's static argument: a pytree with no leaves, by value."""


# Keyword arguments no position takes, mapped over axis 0 as pmap did (pytree).
_Keywords = collections.namedtuple("_Keywords", "named")


def per_device(fun, *, in_axes=0, out_axes=0):
  """``fun`` as pmap called it, in shard_map: no mapped axis in, and it out."""
  # Legacy pmap kept closed-over arrays as constants of device code, as jit does
  embeds = not getattr(jax.config, "jax_pmap_shmap_merge", True)

  def at_axes(change, axes, tree):  # change(leaf, axis) where an axis maps it
    def each(a, sub):
      if RUN_TIME_OPTIONS:  # legacy pmap took a negative axis over no leaf only
        if a is not None and a < 0 and jax.tree.leaves(sub):
          raise ValueError(f"pmap axes must be >= 0 where they map leaves: {a}")
      return sub if a is None else jax.tree.map(lambda x: change(x, a), sub)
    return jax.tree.map(each, axes, tree, is_leaf=lambda a: a is None)

  if SHARD_MAP_BEFORE_0_7_2:
    def apart(_, tree):  # shard_map < 0.7.2 rebuilds trees from placeholders
      leaves, structure = jax.tree.flatten(tree)
      return jax.tree_util.Partial(structure.unflatten, leaves)

  @functools.wraps(fun)
  def body(*args):
    args = at_axes(jax.numpy.squeeze, in_axes, args)
    if STATIC_ARGUMENTS:  # jit holds them static, as pmap did
      static = [i for i, a in enumerate(args) if isinstance(a, _Static)]
      args = [a[0] if i in static else a for i, a in enumerate(args)]
      run = jax.jit(fun, static_argnums=static) if embeds else fun
    else:
      run = jax.jit(fun) if embeds else fun
    if KEYWORD_ARGUMENTS:  # the last argument holds them, if any
      if args and isinstance(args[-1], _Keywords):
        args, run = args[:-1], functools.partial(run, **args[-1].named)
    if SHARD_MAP_BEFORE_0_7_2:
      out = at_axes(jax.numpy.expand_dims, out_axes, run(*args))
      return jax.tree.map(apart, out_axes, out, is_leaf=lambda a: a is None)
    else:
      return at_axes(jax.numpy.expand_dims, out_axes, run(*args))
  body.__name__ = getattr(getattr(fun, "func", fun), "__name__", "body")
  return body


def pmap_devices(*args, in_axes=0, rows=None, backend=None):
  """Legacy pmap's devices for ``args``: one per row (all, multi-process)."""
  axes, tree = jax.tree.flatten(in_axes, is_leaf=lambda a: a is None)
  for axis, sub in zip(axes, tree.flatten_up_to(args), strict=True):
    for x in [] if axis is None else jax.tree.leaves(sub):
      if RUN_TIME_OPTIONS:  # legacy pmap took a negative axis over no leaf only
        if axis < 0:
          said = "pmap axes must be >= 0 where they map leaves: {}"
          raise ValueError(said.format(axis))
      if axis >= jax.numpy.ndim(x):  # legacy pmap's words, which tests match
        said = "pmap was requested to map its argument along axis {}, which "
        said += "implies that its rank should be at least {}, but is only {}"
        raise ValueError(said.format(axis, axis + 1, jax.numpy.ndim(x)))
      rows = jax.numpy.shape(x)[axis] if rows is None else rows
      if RUN_TIME_OPTIONS:  # legacy pmap's words, which JAX's tests match
        if jax.numpy.shape(x)[axis] != rows:
          said = "pmap got inconsistent sizes for array axes to be mapped: {}"
          raise ValueError(said.format([rows, jax.numpy.shape(x)[axis]]))
  if RUN_TIME_OPTIONS:
    if rows is None:
      raise ValueError("pmap needs axis_size where no argument is mapped")
    if rows > jax.local_device_count(backend):
      said = "compiling computation that requires {} replicas, but only {} "
      said += "devices are available to this process"
      raise ValueError(said.format(rows, jax.local_device_count(backend)))
  return jax.devices(backend)[:rows if jax.process_count() == 1 else None]


def placed_on(mesh, specs, static_argnums=()):
  """Decorator for a site's jit: arguments and results placed as pmap did."""
  named = jax.tree.map(lambda s: jax.sharding.NamedSharding(mesh, s), specs)
  puts = jax.tree.map(lambda to: functools.partial(_put, to), named)
  from jax.experimental import multihost_utils as hosts

  def place(xs):
    if STATIC_ARGUMENTS:  # pmap's static_broadcasted_argnums, held as they are
      held = set(static_argnums)
      xs = tuple(_Static((x,)) if i in held else x for i, x in enumerate(xs))
    if jax.process_count() > 1:
      return hosts.host_local_array_to_global_array(xs, mesh, specs)
    return jax.tree.map(jax.tree.map, puts, xs)  # each put over its leaves

  def decorate(jitted):
    @functools.wraps(jitted)
    def call(*args, **kwargs):
      if KEYWORD_CALLS and kwargs:  # to the positions they name
        bound = inspect.signature(jitted).bind(*args, **kwargs)
        args, kwargs = bound.args, bound.kwargs
      if KEYWORD_ARGUMENTS:  # mapped over axis 0 as pmap did, for in_axes=0
        if kwargs and isinstance(specs, PartitionSpec) and len(specs) == 1:
          args, kwargs = (*args, _Keywords(kwargs)), {}
      if kwargs:  # shard_map takes positional arguments only
        raise TypeError(f"pass {', '.join(kwargs)} by position")
      out = jitted(*place(args))
      if SHARD_MAP_BEFORE_0_7_2:  # per_device's Partials: out's only callables
        out = jax.tree.map(lambda part: part(), out, is_leaf=callable)
      if jax.process_count() > 1:  # this process's rows, as pmap gave them
        laid = jax.tree.map(lambda x: x.sharding.spec, out)
        out = hosts.global_array_to_host_local_array(out, mesh, laid)
      return out
    call.lower = lambda *args: jitted.lower(*place(args))
    return call
  return decorate


def _put(to, x):  # Python scalars stay weakly typed, as pmap left them
  placed = isinstance(x, jax.core.Tracer) or getattr(x, "sharding", 0) == to
  return x if placed or not hasattr(x, "__array__") else jax.device_put(x, to)


def on_pmap_mesh(shard_map_partial, *, drop_device_axis, axes=None,
                 static_argnums=(), axis_size=None, devices=None, backend=None,
                 across_hosts=False):
  """Decorator: ``fun`` -> a function for ``jax.jit`` that runs
  ``shard_map_partial`` (shard_map with in_specs / out_specs filled in) over
  pmap's mesh.

  ``axes`` lists the mesh axes, outer first, when the specs alone do not say
  (nested pmaps, or axis_size). ``static_argnums`` arguments reach ``fun``
  unchanged (their in_specs entries are ignored); keyword arguments are mapped
  over their leading axes, as pmap mapped them.
  """
  static_argnums = ((static_argnums,) if isinstance(static_argnums, int)
                    else tuple(static_argnums))
  options = (drop_device_axis, axes, static_argnums, axis_size,
             None if devices is None else tuple(devices), backend,
             across_hosts)

  def decorate(fun):
    return _sharded(fun, shard_map_partial, *options)

  return decorate


def _sharded(fun, shard_map_partial, drop_device_axis, axes, static_argnums,
             axis_size, devices, backend, across_hosts):
  in_specs = _name_unnamed(shard_map_partial.keywords["in_specs"])
  out_specs = _name_unnamed(shard_map_partial.keywords["out_specs"])
  axes = (_axis_names(axes) if axes is not None
          else _axes_of(in_specs, out_specs))

  @functools.wraps(fun)
  def sharded(*args, **kwargs):
    if jax.process_count() > 1 and not across_hosts:
      raise RuntimeError(
          f"{getattr(fun, '__name__', fun)!r} was converted from jax.pmap for "
          f"a single process, but {jax.process_count()} processes are running: "
          "its collectives would span this host's devices only. Rerun "
          "pmap-to-shmap with --multihost.")
    dynamic_specs = _dynamic(in_specs, args, static_argnums)
    dynamic = tuple(arg for i, arg in enumerate(args)
                    if i not in static_argnums)
    # (positional, keyword) arguments
    specs = (dynamic_specs, PartitionSpec(*axes))
    sizes = axis_sizes(axes, specs, (dynamic, kwargs), axis_size)
    mesh = pmap_mesh(axes, sizes, devices, backend, across_hosts)

    def each_device(dynamic, kwargs):
      if drop_device_axis:
        dynamic, kwargs = _drop_mapped_axes(specs, (dynamic, kwargs))
      remaining = iter(dynamic)
      full = [args[i] if i in static_argnums else next(remaining)
              for i in range(len(args))]
      if not getattr(jax.config, "jax_pmap_shmap_merge", True):
        # jit keeps the arrays fun closes over as constants of the per-device
        # code, where pmap had them (shard_map alone passes them in as
        # operands, and XLA may then optimise loops over them differently,
        # changing results in the last bits).
        out = jax.jit(fun, static_argnums=static_argnums)(*full, **kwargs)
      else:
        out = fun(*full, **kwargs)
      return _restore_mapped_axes(out_specs, out) if drop_device_axis else out

    if not _is_spec(out_specs):
      return shard_map_partial(each_device, mesh=mesh, in_specs=specs,
                               out_specs=out_specs)(dynamic, kwargs)
    # One spec for every output: shard_map gets the leaves, and the tree is
    # rebuilt here from them. Some shard_maps rebuild the output tree from
    # placeholder leaves to match it with out_specs, which a pytree class that
    # checks its fields (brax's UInt64) rejects; jit and pmap never do.
    structure = []

    def per_device_leaves(dynamic, kwargs):
      leaves, treedef = jax.tree.flatten(each_device(dynamic, kwargs))
      structure.append(treedef)
      return leaves

    leaves = shard_map_partial(per_device_leaves, mesh=mesh, in_specs=specs,
                               out_specs=out_specs)(dynamic, kwargs)
    return jax.tree.unflatten(structure[-1], leaves)

  # jax.jit names the compiled program after __name__, which wraps() does not
  # copy from a partial: take the function the partial wraps, as jax.jit does
  # for a partial itself.
  named = fun
  while isinstance(named, functools.partial):
    named = named.func
  for attr in ("__name__", "__qualname__"):
    if hasattr(named, attr):
      setattr(sharded, attr, getattr(named, attr))
  return sharded


def host_local_io(jitted, *, in_specs, out_specs, axes=None, static_argnums=(),
                  devices=None):
  """Each process passes and gets back host-local arrays, as it did under pmap.

  Wraps the jitted site: arguments become arrays over the mesh of every
  process's devices (of ``devices``, pmap's global device list, when given),
  and the outputs this process's part again. With one process they are only
  put where the site reads them, so jit compiles once however they were made.
  """
  from jax.experimental import multihost_utils

  static_argnums = ((static_argnums,) if isinstance(static_argnums, int)
                    else tuple(static_argnums))
  in_specs, out_specs = _name_unnamed(in_specs), _name_unnamed(out_specs)
  axes = (_axis_names(axes) if axes is not None
          else _axes_of(in_specs, out_specs))
  devices = None if devices is None else tuple(devices)

  @functools.wraps(jitted)
  def call(*args, **kwargs):
    positions = [i for i in range(len(args)) if i not in static_argnums]
    dynamic = tuple(args[i] for i in positions)
    specs = (_dynamic(in_specs, args, static_argnums), PartitionSpec(*axes))
    local = axis_sizes(axes, specs, (dynamic, kwargs), None)
    # pmap's global axis: every process's local devices, or all of `devices`
    # when given (each process then maps over its own devices among them).
    outer = (len(devices) // math.prod(local[1:]) if devices is not None
             else local[0] * jax.process_count())
    mesh = pmap_mesh(axes, (outer,) + local[1:], devices, None, True)
    if jax.process_count() == 1:
      dynamic, kwargs = jax.tree.map(
          lambda spec, sub: jax.tree.map(
              lambda x: _put(jax.sharding.NamedSharding(mesh, spec), x), sub),
          specs, (dynamic, kwargs), is_leaf=_is_spec)
    else:
      dynamic, kwargs = multihost_utils.host_local_array_to_global_array(
          (dynamic, kwargs), mesh, specs)
    full = list(args)
    for i, value in zip(positions, dynamic, strict=True):
      full[i] = value
    out = jitted(*full, **kwargs)
    if jax.process_count() == 1:
      return out
    return multihost_utils.global_array_to_host_local_array(
        out, mesh, out_specs)

  return call


@functools.lru_cache(maxsize=64)
def pmap_mesh(axes, sizes, devices=None, backend=None, across_hosts=False):
  """The mesh pmap ran on: the first prod(sizes) devices (local ones unless
  across_hosts), laid out row-major. Axis types are given, not left to the JAX
  version's default."""
  if devices is not None:
    pool = list(devices)
  elif across_hosts:
    pool = sorted(jax.devices(backend), key=lambda d: d.process_index)
  else:
    pool = jax.local_devices(backend=backend)
  needed = math.prod(sizes)
  if needed > len(pool) or (devices is not None and needed != len(pool)):
    raise ValueError(f"the mapped axes have sizes {sizes} ({needed} devices) "
                     f"but {len(pool)} devices are available to map over")
  auto = ((jax.sharding.AxisType.Auto,) * len(axes)
          if hasattr(jax.sharding, "AxisType") else None)
  grid = np.array(pool[:needed]).reshape(sizes)
  if auto is None:
    return jax.sharding.Mesh(grid, axes)
  return jax.sharding.Mesh(grid, axes, axis_types=auto)


def pmap_via_shard_map(fun, axis_name=None, *, in_axes=0, out_axes=0,
                       devices=None, backend=None, axis_size=None,
                       donate_argnums=(), global_arg_shapes=None,
                       static_broadcasted_argnums=()):
  """``jax.pmap`` for options known only at run time: ``jax.jit`` over
  shard_map of ``per_device(fun)``, on ``devices``, else on as many devices as
  the arguments have rows (``pmap_devices``)."""
  if global_arg_shapes is not None:
    raise ValueError("global_arg_shapes is not supported: remove it from pmap")
  name = _UNNAMED if axis_name is None else axis_name
  in_axes = tuple(in_axes) if isinstance(in_axes, list) else in_axes
  body = per_device(fun, in_axes=in_axes, out_axes=out_axes)
  jit_options = dict(donate_argnums=donate_argnums)
  if STATIC_ARGUMENTS:
    static = tuple(jax.tree.leaves(static_broadcasted_argnums))
    jit_options.update(static_argnums=static)

  def spec(axis):  # pmap's axis k: the mesh axis at dimension k
    if axis is not None and not isinstance(axis, int):
      raise ValueError(f"pmap axes must be ints or None, got {axis!r}")
    dims = [] if axis is None else [None] * max(axis, 0) + [name]
    return PartitionSpec(*dims)

  in_specs = jax.tree.map(spec, in_axes, is_leaf=lambda a: a is None)
  out_specs = jax.tree.map(spec, out_axes, is_leaf=lambda a: a is None)
  if SHARD_MAP_BEFORE_0_7_2 and not hasattr(jax, "shard_map"):
    from jax.experimental.shard_map import shard_map as experimental
    shard_map = functools.partial(experimental, check_rep=False)
  else:
    shard_map = functools.partial(jax.shard_map, check_vma=False)

  @functools.cache
  def on(pool):  # the site over a tuple of devices
    mesh = jax.sharding.Mesh(pool, (name,))
    mapped = shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    if STATIC_ARGUMENTS:
      return placed_on(mesh, in_specs, static)(jax.jit(mapped, **jit_options))
    else:
      return placed_on(mesh, in_specs)(jax.jit(mapped, **jit_options))

  def site(xs):
    if devices is not None:
      return on(tuple(devices))
    if STATIC_ARGUMENTS:  # no rows, as leaves of no tree
      xs = tuple(_Static((x,)) if i in static else x for i, x in enumerate(xs))
    rows = dict(in_axes=in_axes, rows=axis_size, backend=backend)
    return on(tuple(pmap_devices(*xs, **rows)))

  @functools.wraps(fun)
  def call(*args, **kwargs):
    return site(args)(*args, **kwargs)
  call.lower = lambda *args: site(args).lower(*args)
  return call


def device_put_replicated(x, devices=None, axis_name="devices"):
  """What jax.device_put_replicated returned: x stacked once per device, slice
  i on devices[i] (pytrees leaf by leaf); ``devices`` defaults to this
  process's devices, the order Flax's ``replicate`` used. Stacked over the mesh
  axis of the converted site they feed, the values are laid out as its outputs
  are, so its jit compiles once for the first step and the next ones."""
  devices = jax.local_devices() if devices is None else list(devices)
  if not devices:
    raise ValueError("device_put_replicated needs a non-empty list of devices")
  stack = functools.partial(_stacked, devices=devices, axis_name=axis_name)
  return jax.tree.map(lambda v: stack([v] * len(devices)), x)


def device_put_sharded(shards, devices):
  """What jax.device_put_sharded returned: the shards stacked, shard i on
  devices[i]."""
  devices = list(devices)
  if len(shards) != len(devices):
    said = "device_put_sharded got {} shards for {} devices"
    raise ValueError(said.format(len(shards), len(devices)))
  return jax.tree.map(lambda *xs: _stacked(xs, devices), *shards)


def first_row(x):
  """``x[0]`` as legacy pmap gave it: row 0 read from a device holding it whole,
  every bit kept (``x[0]`` of an array split across devices adds up the rows,
  which turns -0.0 into 0.0)."""
  whole = isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
  whole = whole and x.ndim and x.size
  if whole and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):
    for shard in x.addressable_shards:
      if not shard.index[0].start and shard.data.shape[1:] == x.shape[1:]:
        return _row_zero(shard.data)
  return x[0]


def first_rows(tree):
  """``first_row`` of each leaf (flax's ``unreplicate``)."""
  return jax.tree.map(first_row, tree)


_row_zero = jax.jit(lambda block: block[0])


def _stacked(values, devices, axis_name="devices"):
  """``values`` stacked along ``axis_name`` of a mesh over ``devices``. Arrays
  are stacked on the host, compiling nothing (legacy compiled at most one
  program); Python numbers (weakly typed) and PRNG keys are stacked by JAX."""
  mesh = jax.sharding.Mesh(devices, (axis_name,))
  sharding = jax.sharding.NamedSharding(mesh, PartitionSpec(axis_name))
  if not all(map(_stacks_on_host, values)):
    stacked = jax.numpy.stack([jax.numpy.asarray(v) for v in values])
  elif all(v is values[0] for v in values):  # replicas: one host copy
    row = np.asarray(values[0])
    stacked = np.broadcast_to(row, (len(values), *row.shape))
  else:
    stacked = np.stack([np.asarray(v) for v in values])
  return jax.device_put(stacked, sharding)


def _stacks_on_host(v):  # an array: not a Python number, tracer or PRNG key
  if isinstance(v, (np.ndarray, np.generic)):
    return v.dtype != object
  if not isinstance(v, jax.Array) or isinstance(v, jax.core.Tracer):
    return False
  keys = jax.dtypes.issubdtype(v.dtype, jax.dtypes.extended)
  return not (keys or v.weak_type)


def _is_spec(x):
  return isinstance(x, PartitionSpec)


# pmap's axis_name=None: the axis gets a name no user function refers to.
_UNNAMED = "_pmap_unnamed_axis"


def _axis_names(axes):
  return tuple(_UNNAMED if name is None else name for name in axes)


def _name_unnamed(specs):
  """A site's specs name the mapped axis last; a run-time axis_name of None
  leaves None there (``PartitionSpec(axis_name)`` with axis_name=None), which
  stands for pmap's unnamed axis."""
  def name(spec):
    return (PartitionSpec(*spec[:-1], _UNNAMED)
            if len(spec) and spec[-1] is None else spec)
  return jax.tree.map(name, specs, is_leaf=_is_spec)


def _axes_of(*specs):
  """The mesh axis names the specs use, in order of appearance."""
  names = []
  for spec in jax.tree.leaves(specs, is_leaf=_is_spec):
    for entry in spec:
      for name in entry if isinstance(entry, tuple) else (entry,):
        if name is not None and name not in names:
          names.append(name)
  if len(names) != 1:
    raise ValueError(f"pmap's specs use the mesh axes {names}; pass "
                     "axes=(...) in mesh order")
  return tuple(names)


def _dynamic(in_specs, args, static_argnums):
  """The in_specs of the non-static positional arguments (one spec applies to
  all)."""
  if _is_spec(in_specs):
    return in_specs
  if len(in_specs) != len(args):
    raise ValueError(f"pmap in_axes has {len(in_specs)} entries but the "
                     f"function was called with {len(args)} positional "
                     "arguments")
  return tuple(s for i, s in enumerate(in_specs) if i not in static_argnums)


def _mapped(spec):
  """The array axes a spec maps, with their mesh axis:
  PartitionSpec(None, "i") -> [(1, "i")]."""
  return [(axis, name) for axis, name in enumerate(spec) if name is not None]


def axis_sizes(axes, specs, tree, axis_size):
  """Each mesh axis's size, read off the arguments mapped over it (as pmap
  did)."""
  sizes = {}

  def record(spec, subtree):
    for leaf in jax.tree.leaves(subtree):
      for axis, name in _mapped(spec):
        if axis >= np.ndim(leaf):
          raise ValueError(f"pmap in_axes maps axis {axis} of an argument of "
                           f"rank {np.ndim(leaf)}")
        size = np.shape(leaf)[axis]
        if sizes.setdefault(name, size) != size:
          raise ValueError("pmap got inconsistent sizes for the mapped axis "
                           f"{name!r}: {sizes[name]} and {size}")

  jax.tree.map(record, specs, tree, is_leaf=_is_spec)
  if axis_size is not None and len(axes) == 1:
    sizes.setdefault(axes[0], axis_size)
  missing = [name for name in axes if name not in sizes]
  if missing:
    raise ValueError(
        f"no argument is mapped over {missing}; pass axis_size to pmap")
  return tuple(sizes[name] for name in axes)


def _drop_mapped_axes(specs, tree):
  """pmap hid the mapped axes from the function; shard_map keeps them as
  size-1 blocks."""
  def drop(spec, subtree):
    axes = tuple(axis for axis, _ in _mapped(spec))
    return (jax.tree.map(lambda leaf: jax.lax.squeeze(leaf, axes), subtree)
            if axes else subtree)
  return jax.tree.map(drop, specs, tree, is_leaf=_is_spec)


def _restore_mapped_axes(specs, tree):
  """Puts the mapped axes back on the function's outputs, where out_specs
  placed them."""
  def restore(spec, subtree):
    axes = tuple(axis for axis, _ in _mapped(spec))
    return (jax.tree.map(lambda leaf: jax.lax.expand_dims(leaf, axes), subtree)
            if axes else subtree)
  return jax.tree.map(restore, specs, tree, is_leaf=_is_spec)


def on_first_call(build):
  """The site ``build()`` makes, made on its first call instead of at import,
  since its mesh asks JAX for the devices: a program may do that only after
  jax.distributed.initialize. A def's decorator is ``on_first_call(lambda f:
  ...)``, the site ``build`` makes of the def."""
  if inspect.signature(build).parameters:
    return lambda fun: functools.wraps(fun)(on_first_call(lambda: build(fun)))
  site = functools.cache(build)

  def call(*args, **kwargs):
    return site()(*args, **kwargs)
  call.lower = lambda *args, **kwargs: site().lower(*args, **kwargs)
  return call
