"""Reading and writing recordings: `manifest.json` plus one `.npy` file per array leaf.

The format is described in the package docstring (pmap_compat/testing/__init__.py);
this module is its only reader and writer.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import shutil
import tempfile
from typing import Any

import jax
import numpy as np

from pmap_compat.testing import trees

FORMAT = "pmap_compat.testing/1"
MANIFEST = "manifest.json"
LEAF_DIR = "leaves"
PROCESS_DIR = "process_{}"

# Leaf kinds: what the program returned at that position.
JAX_ARRAY, KEY_ARRAY = "jax.Array", "jax.Array[key]"
NUMPY_ARRAY, NUMPY_SCALAR = "numpy.ndarray", "numpy.scalar"
PYTHON_KINDS = {bool: "python.bool", int: "python.int", float: "python.float",
                complex: "python.complex", str: "python.str"}
# Any other Python value among a pmap call's arguments (a static argument, say): kept as
# its repr, compared as text; a replayed call passes the program's own value.
OPAQUE = "python.object"
INLINE_KINDS = ("python.str", OPAQUE)  # kept in the manifest, no file


@dataclasses.dataclass
class Leaf:
  """One recorded (or freshly computed) output leaf.

  `value` is a numpy array for every kind except python.str; for typed PRNG keys it
  holds the key data (`jax.random.key_data`) and `key_impl` names the implementation.
  `shape` and `dtype` are those of the leaf itself (a key array's own shape and dtype).
  """
  path: str
  kind: str
  dtype: str
  shape: tuple[int, ...]
  value: Any
  key_impl: str | None = None


@dataclasses.dataclass
class Recording:
  """A program's outputs: their structure, leaves, and what produced them."""
  tree: dict
  leaves: list[Leaf]
  producer: dict
  metadata: dict = dataclasses.field(default_factory=dict)
  directory: str | None = None


def dtype_name(dtype: Any) -> str:
  return "float0" if dtype == jax.dtypes.float0 else str(np.dtype(dtype))


def numpy_dtype(name: str) -> np.dtype:
  """The numpy dtype for a recorded name, including ml_dtypes ones (bfloat16, int4, ...)."""
  if name == "float0":
    return np.dtype(jax.dtypes.float0)
  try:
    return np.dtype(name)
  except TypeError:
    import ml_dtypes  # a dependency of every jaxlib; registers bfloat16 & co with numpy
    return np.dtype(getattr(ml_dtypes, name))


def key_impl_name(keys: Any) -> str:
  """The name of a key array's PRNG implementation, as ``jax.random.wrap_key_data(impl=)``
  takes it (``threefry2x32``): ``jax.random.key_impl`` returns it from jax 0.5, a spec
  before, whose ``str`` is a short tag on 0.4.35 (``fry``) and whose implementation holds
  the name."""
  impl = jax.random.key_impl(keys)
  if isinstance(impl, str):
    return impl
  return str(getattr(getattr(impl, "_impl", None), "name", None) or impl)


def to_leaf(path: str, x: Any, opaque: bool = False) -> Leaf:
  """Converts one output leaf to host data; raises TypeError for what cannot be stored,
  or with `opaque` keeps it as an OPAQUE leaf (its repr)."""
  if isinstance(x, jax.Array):
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      return Leaf(path, KEY_ARRAY, str(x.dtype), tuple(x.shape),
                  np.asarray(jax.random.key_data(x)), key_impl=key_impl_name(x))
    value = np.asarray(x) if x.is_fully_addressable else process_local_block(path, x)
    return Leaf(path, JAX_ARRAY, dtype_name(x.dtype), value.shape, value)
  if isinstance(x, np.ndarray):
    return Leaf(path, NUMPY_ARRAY, dtype_name(x.dtype), x.shape, x)
  if isinstance(x, np.generic):
    return Leaf(path, NUMPY_SCALAR, dtype_name(x.dtype), (), np.asarray(x))
  kind = PYTHON_KINDS.get(type(x))
  if kind == "python.str":
    return Leaf(path, kind, "str", (), x)
  if kind is not None:
    value = np.asarray(x)
    return Leaf(path, kind, dtype_name(value.dtype), (), value)
  if opaque:
    return Leaf(path, OPAQUE, type(x).__qualname__, (), repr(x))
  raise TypeError(f"output leaf at {trees.display_path(path)} is a {type(x).__name__}; a "
                  "recording holds arrays (jax, numpy), numpy scalars, and python bool, int, "
                  "float, complex and str")


def process_local_block(path: str, x: jax.Array) -> np.ndarray:
  """The part of a global array this process holds, as one array: what legacy pmap gave
  each process (its local devices' slices), so a converted multi-host program that
  returns global arrays still compares with a legacy recording."""
  bounds = [[(s.start or 0, dim if s.stop is None else s.stop)
             for s, dim in zip(shard.index, x.shape, strict=True)]
            for shard in x.addressable_shards]
  low = [min(b[d][0] for b in bounds) for d in range(x.ndim)]
  high = [max(b[d][1] for b in bounds) for d in range(x.ndim)]
  block = np.empty([h - l for l, h in zip(low, high, strict=True)], np.dtype(x.dtype))
  covered = np.zeros(block.shape, bool)
  for shard, bound in zip(x.addressable_shards, bounds, strict=True):
    where = tuple(slice(a - l, b - l) for (a, b), l in zip(bound, low, strict=True))
    block[where] = np.asarray(shard.data)
    covered[where] = True
  if not covered.all():
    raise TypeError(f"output leaf at {trees.display_path(path)} is a global array whose "
                    "shards on this process do not form one block; return a process-local "
                    "value (e.g. jax.experimental.multihost_utils.process_allgather) instead")
  return block


def outputs_to_leaves(outputs: Any) -> tuple[dict, list[Leaf]]:
  tree, flat = trees.describe(outputs)
  return tree, [to_leaf(path, x) for path, x in flat]


def _storable(value: np.ndarray) -> tuple[np.ndarray, str | None]:
  """numpy's .npy cannot name ml_dtypes (bfloat16, float8_*, int4): store their bits."""
  if value.dtype.kind != "V":
    return value, None
  bits = np.dtype(f"uint{8 * value.dtype.itemsize}")
  return value.view(bits), str(bits)


def jax_versions() -> dict:
  import jaxlib  # pylint: disable=import-outside-toplevel
  return {"jax": jax.__version__, "jaxlib": getattr(jaxlib, "__version__", "?")}


def which_pmap() -> str:
  """What `jax.pmap` is in this process right now."""
  pmap = getattr(jax, "pmap", None)
  if pmap is None:
    return "none (this jax has no jax.pmap)"
  if getattr(pmap, "__module__", "").startswith("pmap_compat"):
    return "pmap_compat.pmap"
  # The flag chooses between the two pmaps (legacy unless set); JAX dropped it with legacy.
  if getattr(jax.config, "jax_pmap_shmap_merge", True):
    return "jax.pmap (JAX's shard_map-based pmap)"
  return "legacy jax.pmap"


def source_digest(path: str | None) -> str | None:
  """The sha256 of a program's source file (None if there is none to read)."""
  if path is None or not os.path.isfile(path):
    return None
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def producer_info(program: str | None, function: str | None, kwargs: dict | None,
                  uses_pmap: bool | None) -> dict:
  """Everything about the run that produced a recording (stored, and shown by `check`)."""
  pmap = which_pmap()
  produced_by = pmap if uses_pmap is not False else (
      "code that does not call pmap (converted code / shard_map)")
  return {**jax_versions(), "numpy": np.__version__, "python": platform.python_version(),
          "platform": jax.default_backend(), "device_count": jax.device_count(),
          "process_index": jax.process_index(), "process_count": jax.process_count(),
          "pmap": pmap, "produced_by": produced_by, "program": program,
          # check --calibrate runs the recorded program only if it is still this source.
          "program_sha256": source_digest(program), "function": function, "kwargs": kwargs,
          # jax 0.5.0 flipped its default, which changes every random number drawn.
          "threefry_partitionable": getattr(jax.config, "jax_threefry_partitionable", None)}


def process_directory(directory: str, process_index: int, process_count: int) -> str:
  """Where one process's recording lives: DIR itself, or DIR/process_<i> in a multi-process job."""
  if process_count == 1:
    return directory
  return os.path.join(directory, PROCESS_DIR.format(process_index))


def write(directory: str, outputs: Any, producer: dict, metadata: dict | None = None) -> Recording:
  """Writes a recording of `outputs` into `directory` (replacing one that is there)."""
  tree, leaves = outputs_to_leaves(outputs)
  return write_leaves(directory, tree, leaves, producer, metadata)


def _copies(value: np.ndarray) -> int:
  """n when `value` is n bitwise-identical copies along its leading axis (pmap's replicated
  state), else 0."""
  if value.ndim == 0 or value.shape[0] < 2 or value.size == 0 or value.dtype.itemsize == 0:
    return 0
  flat = np.ascontiguousarray(value).view(np.uint8).reshape(value.shape[0], -1)
  return value.shape[0] if bool((flat == flat[:1]).all()) else 0


def stored_bytes(leaves: list[Leaf], dedupe: bool) -> int:
  """What `write_leaves` puts on disk for these leaves' values (manifest aside)."""
  total = 0
  for leaf in leaves:
    if isinstance(leaf.value, np.ndarray):
      copies = _copies(leaf.value) if dedupe else 0
      total += leaf.value.nbytes // (copies or 1)
  return total


def write_leaves(directory: str, tree: dict, leaves: list[Leaf], producer: dict,
                 metadata: dict | None = None, dedupe: bool = False) -> Recording:
  """Writes a recording of leaves already on the host. With `dedupe`, a leaf made of
  identical copies along its leading axis is stored once (`copies` in its entry)."""
  parent = os.path.dirname(os.path.abspath(directory))
  os.makedirs(parent, exist_ok=True)
  staging = tempfile.mkdtemp(prefix=".recording-", dir=parent)
  os.makedirs(os.path.join(staging, LEAF_DIR))
  entries = []
  for i, leaf in enumerate(leaves):
    entry: dict[str, Any] = {"path": leaf.path, "kind": leaf.kind, "dtype": leaf.dtype, "shape": list(leaf.shape)}
    if leaf.key_impl is not None:
      entry["key_impl"] = leaf.key_impl
    if leaf.kind in INLINE_KINDS:
      entry["value"] = leaf.value
    elif leaf.dtype != "float0":
      data = np.asarray(leaf.value, order="C")  # keeps 0-d arrays 0-d
      copies = _copies(data) if dedupe else 0
      if copies:
        data, entry["copies"] = data[0], copies
      data, stored_as = _storable(data)
      entry["file"] = f"{LEAF_DIR}/{i:05d}.npy"
      if stored_as:
        entry["stored_as"] = stored_as
      np.save(os.path.join(staging, entry["file"]), data, allow_pickle=False)
    entries.append(entry)
  manifest = {"format": FORMAT, "producer": producer, "metadata": metadata or {}, "tree": tree,
              "leaves": entries}
  with open(os.path.join(staging, MANIFEST), "w", encoding="utf-8") as f:
    json.dump(manifest, f, indent=1, sort_keys=False)
  if os.path.exists(directory):
    shutil.rmtree(directory)
  os.replace(staging, directory)  # readers never see a half-written recording
  return Recording(tree, leaves, producer, metadata or {}, directory)


def require(directory: str) -> None:
  """Raises FileNotFoundError unless `directory` holds a recording (or one per process)."""
  if not (os.path.exists(os.path.join(directory, MANIFEST)) or
          os.path.exists(os.path.join(process_directory(directory, 0, 2), MANIFEST))):
    raise FileNotFoundError(f"no recording at {directory}: {MANIFEST} is missing")


def read_producer(directory: str) -> dict:
  """What produced a recording, without reading its leaves."""
  with open(os.path.join(directory, MANIFEST), encoding="utf-8") as f:
    return json.load(f)["producer"]


def read(directory: str) -> Recording:
  """Reads a recording; raises FileNotFoundError / ValueError naming what is wrong."""
  path = os.path.join(directory, MANIFEST)
  if not os.path.exists(path):
    found = sorted(d for d in os.listdir(directory)) if os.path.isdir(directory) else []
    hint = (f"; it holds {', '.join(found)} (a multi-process recording: one per process)"
            if any(d.startswith("process_") for d in found) else "")
    raise FileNotFoundError(f"no recording at {directory}: {MANIFEST} is missing{hint}")
  with open(path, encoding="utf-8") as f:
    manifest = json.load(f)
  if manifest.get("format") != FORMAT:
    raise ValueError(f"{path} is not a {FORMAT} recording (format {manifest.get('format')!r})")
  leaves = []
  for entry in manifest["leaves"]:
    shape = tuple(entry["shape"])
    if entry["kind"] in INLINE_KINDS:
      value = entry["value"]
    elif entry["dtype"] == "float0":
      value = np.zeros(shape, numpy_dtype("float0"))
    else:
      value = np.load(os.path.join(directory, entry["file"]), allow_pickle=False)
      if "stored_as" in entry:
        value = value.view(numpy_dtype(entry["dtype"]))
      if "copies" in entry:
        value = np.repeat(value[None], entry["copies"], axis=0)
      data_shape = value.shape[:len(shape)] if entry["kind"] == KEY_ARRAY else value.shape
      if data_shape != shape:
        raise ValueError(f"{directory}: {entry['file']} holds shape {value.shape}, the manifest "
                         f"says {shape} for {trees.display_path(entry['path'])}")
    leaves.append(Leaf(entry["path"], entry["kind"], entry["dtype"], shape, value,
                       entry.get("key_impl")))
  return Recording(manifest["tree"], leaves, manifest["producer"], manifest.get("metadata", {}),
                   directory)
