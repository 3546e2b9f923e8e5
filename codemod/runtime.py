"""The helper functions the rewrite adds to a converted file, as source text.

Every converted pmap site calls ``_pmap_as_shard_map``: it turns pmap's per-device
function into the body of a ``shard_map`` over the local devices, to be wrapped in
``jax.jit`` at the site. The helper exists (rather than an inline ``shard_map``) so the
mesh can be built on the first call instead of at import, and so the rank-reducing
step pmap performed -- hide the mapped axis from the function, put it back on the
outputs -- is written once, readably, and driven by the specs written at the site.

The text depends on the ``--target`` (which shard_map API) and on ``--multihost``.
"""
from __future__ import annotations

HELPER_NAME = "_pmap_as_shard_map"
HOST_LOCAL_NAME = "_pmap_host_local_io"
SPECS_NAME = "_pmap_specs_from_axes"
MARKER = "# --- pmap-to-shmap helpers"

_HEADER = '''\
# --- pmap-to-shmap helpers: the rewritten pmap sites in this file call these. ---
# Like pmap, a mapped axis of size n runs on the first n {pool},
# in order; the intended setup is n == {count}. Meshes are built on
# first use, once per size, so importing this file does not start JAX's backend.
'''

_MESH = '''\
@functools.lru_cache(maxsize=None)
def _pmap_mesh(axis_names, axis_sizes, devices=None, backend=None):
    """The mesh pmap ran on: the first prod(axis_sizes) devices, laid out row-major."""
    import math
    import numpy

    if devices is None:
        pool = {pool_expr}
    else:
        pool = list(devices)
    needed = math.prod(axis_sizes)
    if needed > len(pool) or (devices is not None and needed != len(pool)):
        raise ValueError(
            f"the mapped axes have sizes {{axis_sizes}} ({{needed}} devices) but "
            f"{{len(pool)}} devices are available to map over")
    return jax.sharding.Mesh(numpy.array(pool[:needed]).reshape(axis_sizes), axis_names)
'''

_SPEC_TOOLS = '''\
def _pmap_is_spec(x):
    return isinstance(x, jax.sharding.PartitionSpec)


def _pmap_spec_axes(spec):
    """The array axes a spec maps, with their mesh axis: P(None, "i") -> [(1, "i")]."""
    return [(axis, name) for axis, name in enumerate(spec) if name is not None]


def _pmap_axis_sizes(axis_names, specs, tree, axis_size):
    """Each mesh axis's size, read off the arguments mapped over it (as pmap did)."""
    sizes = {{}}

    def record(spec, subtree):
        for leaf in jax.tree.leaves(subtree):
            for axis, name in _pmap_spec_axes(spec):
                if axis >= jax.numpy.ndim(leaf):
                    raise ValueError(
                        f"pmap in_axes maps axis {{axis}} of an argument of rank "
                        f"{{jax.numpy.ndim(leaf)}}")
                size = jax.numpy.shape(leaf)[axis]
                if sizes.setdefault(name, size) != size:
                    raise ValueError(
                        f"pmap got inconsistent sizes for the mapped axis {{name!r}}: "
                        f"{{sizes[name]}} and {{size}}")

    jax.tree.map(record, specs, tree, is_leaf=_pmap_is_spec)
    if axis_size is not None and len(axis_names) == 1:
        sizes.setdefault(axis_names[0], axis_size)
    missing = [name for name in axis_names if name not in sizes]
    if missing:
        raise ValueError(f"no argument is mapped over {{missing}}; pass axis_size to pmap")
    return tuple(sizes[name] for name in axis_names)


def _pmap_drop_mapped_axes(specs, tree):
    """pmap hid the mapped axes from the function; shard_map keeps them as size-1 blocks."""

    def drop(spec, subtree):
        axes = tuple(axis for axis, _ in _pmap_spec_axes(spec))
        if not axes:
            return subtree
        return jax.tree.map(lambda leaf: jax.lax.squeeze(leaf, axes), subtree)

    return jax.tree.map(drop, specs, tree, is_leaf=_pmap_is_spec)


def _pmap_restore_mapped_axes(specs, tree):
    """Puts the mapped axes back on the function's outputs, where out_axes placed them."""

    def restore(spec, subtree):
        axes = tuple(axis for axis, _ in _pmap_spec_axes(spec))
        if not axes:
            return subtree
        return jax.tree.map(lambda leaf: jax.lax.expand_dims(leaf, axes), subtree)

    return jax.tree.map(restore, specs, tree, is_leaf=_pmap_is_spec)
'''

_MAIN = '''\
_pmap_wrappers = {{}}


def _pmap_as_shard_map(fun, **options):
    """pmap(fun) as a function to wrap in jax.jit: a shard_map over the mesh pmap used.

    The same (fun, options) gives the same function back, so that a site evaluated
    again (say, in a loop) reuses jax.jit's traces, as re-created pmaps did.
    """
    try:
        key = (fun, repr(sorted(options.items())))
        hash(key)
    except TypeError:  # an unhashable function: nothing to share
        return _pmap_build(fun, **options)
    if key not in _pmap_wrappers:
        if len(_pmap_wrappers) >= 256:
            _pmap_wrappers.pop(next(iter(_pmap_wrappers)))
        _pmap_wrappers[key] = _pmap_build(fun, **options)
    return _pmap_wrappers[key]


def _pmap_build(
        fun, *, axes, in_specs, out_specs, static_argnums=(), axis_size=None,
        devices=None, backend=None):
    """The function _pmap_as_shard_map returns.

    in_specs has an entry per positional argument (or one spec for all), as pmap's
    in_axes did, including entries for static arguments, which reach `fun` unchanged.
    Keyword arguments are mapped over their leading axes, as pmap mapped them.
    """
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if devices is not None:
        devices = tuple(devices)
    kwargs_spec = jax.sharding.PartitionSpec(*axes)

    @functools.wraps(fun)
    def sharded(*args, **kwargs):
        static = {{i: args[i] for i in static_argnums}}
        dynamic = tuple(arg for i, arg in enumerate(args) if i not in static)
        if _pmap_is_spec(in_specs):
            dynamic_specs = in_specs
        else:
            if len(in_specs) != len(args):
                raise ValueError(
                    f"pmap in_axes has {{len(in_specs)}} entries but the function was "
                    f"called with {{len(args)}} positional arguments")
            dynamic_specs = tuple(s for i, s in enumerate(in_specs) if i not in static)
        specs = (dynamic_specs, kwargs_spec)
        sizes = _pmap_axis_sizes(axes, specs, (dynamic, kwargs), axis_size)
        mesh = _pmap_mesh(tuple(axes), sizes, devices, backend)

        def per_device(dynamic, kwargs):
            dynamic, kwargs = _pmap_drop_mapped_axes(specs, (dynamic, kwargs))
            remaining = iter(dynamic)
            full_args = [
                static[i] if i in static else next(remaining) for i in range(len(args))]
            return _pmap_restore_mapped_axes(out_specs, fun(*full_args, **kwargs))

        mapped = {shard_map_call}
        return mapped(dynamic, kwargs)

    sharded.pmap_layout = (tuple(axes), in_specs, out_specs, tuple(static_argnums))
    return sharded
'''

_RUNTIME_SPECS = '''\
def _pmap_specs_from_axes(axes, axis_name, outputs=False):
    """in_axes / out_axes known only at run time, as specs (k -> P(None, ..., name))."""
    if isinstance(axes, list) and not outputs:
        axes = tuple(axes)  # pmap reads a top-level in_axes list as the argument tuple

    def to_spec(axis):
        if axis is None:
            return jax.sharding.PartitionSpec()
        if not isinstance(axis, int) or axis < 0:
            raise ValueError(f"pmap axes must be non-negative ints or None, got {{axis!r}}")
        return jax.sharding.PartitionSpec(*([None] * axis), axis_name)

    return jax.tree.map(to_spec, axes, is_leaf=lambda x: x is None)
'''

_SHARD_MAP_CALL = {
    "experimental": "shard_map(per_device, mesh, specs, out_specs, check_rep=False)",
    "jax": ("jax.shard_map(\n"
            "            per_device, mesh=mesh, in_specs=specs, out_specs=out_specs,\n"
            "            check_vma=False)"),
}

_HOST_LOCAL = '''\
def _pmap_host_local_io(jitted):
    """Lets each process pass and get back host-local arrays, as it did under pmap.

    Under pmap a process passed arrays holding only its own devices' slices;
    multihost_utils turns them into arrays over the global mesh, and back.
    """
    from jax.experimental import multihost_utils

    axes, in_specs, out_specs, static_argnums = jitted.__wrapped__.pmap_layout

    @functools.wraps(jitted)
    def call(*args, **kwargs):
        positions = [i for i in range(len(args)) if i not in static_argnums]
        dynamic = tuple(args[i] for i in positions)
        if _pmap_is_spec(in_specs):
            dynamic_specs = in_specs
        else:
            dynamic_specs = tuple(in_specs[i] for i in positions)
        specs = (dynamic_specs, jax.sharding.PartitionSpec(*axes))
        local_sizes = _pmap_axis_sizes(axes, specs, (dynamic, kwargs), None)
        sizes = (local_sizes[0] * jax.process_count(),) + local_sizes[1:]
        mesh = _pmap_mesh(axes, sizes)
        dynamic, kwargs = multihost_utils.host_local_array_to_global_array(
            (dynamic, kwargs), mesh, specs)
        full_args = list(args)
        for i, value in zip(positions, dynamic):
            full_args[i] = value
        out = jitted(*full_args, **kwargs)
        return multihost_utils.global_array_to_host_local_array(out, mesh, out_specs)

    return call
'''

_POOLS = {
    False: ("local devices", "jax.local_device_count()",
            "jax.local_devices(backend=backend)"),
    True: ("global devices (process by process)", "jax.device_count()",
           "sorted(jax.devices(backend), key=lambda d: d.process_index)"),
}


def helper_source(target: str, multihost: bool = False, indent: str = "    ",
                  runtime_specs: bool = False) -> str:
  """The helper block for ``target`` ('experimental' or 'jax'), indented with ``indent``."""
  if target not in _SHARD_MAP_CALL:
    raise ValueError(f"target must be 'experimental' or 'jax', got {target!r}")
  pool, count, pool_expr = _POOLS[multihost]
  parts = [_HEADER.format(pool=pool, count=count), _MESH.format(pool_expr=pool_expr),
           _SPEC_TOOLS.format(), _MAIN.format(shard_map_call=_SHARD_MAP_CALL[target])]
  if multihost:
    parts.append(_HOST_LOCAL)
  if runtime_specs:
    parts.append(_RUNTIME_SPECS.format())
  return _reindent("\n\n".join(parts), indent)


def _reindent(text: str, indent: str) -> str:
  if indent == "    ":
    return text
  out = []
  for line in text.splitlines(keepends=True):
    stripped = line.lstrip(" ")
    levels, extra = divmod(len(line) - len(stripped), 4)
    out.append(indent * levels + " " * extra + stripped)
  return "".join(out)
