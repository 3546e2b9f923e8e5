"""Per-call recordings: the inputs and outputs of each pmap site's first calls.

Layout, inside a recording directory (this process's part of it)::

  calls/sites.json                 {"format": "pmap_compat.testing.calls/1",
                                    "calls_per_site": K, "max_bytes": B, "bytes": used,
                                    "sites": [{"key", "module", "qualname", "file", "line",
                                               "calls": how often the program called it,
                                               "recorded": how many of those are stored,
                                               "directory"}, ...]}
  calls/site_000/call_00000/inputs   a recording (manifest.json + leaves/) of the call's
  calls/site_000/call_00000/outputs  (args, kwargs), and one of what it returned
  calls/site_000/call_00000/loops    where the call holds loops: each iteration's carry
  calls/site_000/call_00000/stepped  and what the call returned with them (loop_records)

Inputs are the pytree `(args, kwargs)` as the site received it; a leaf that is no array
or Python scalar (a static argument's object) is kept as its repr (kind `python.object`).
Leaves holding identical copies along their leading axis (pmap's replicated parameters)
are stored once (`copies` in the manifest entry), so replicated state costs one device's
share of disk.
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import os
import shutil
import tempfile
from typing import Any

import jax
import numpy as np

from pmap_compat.testing import loop_records, recordings, trees
from pmap_compat.testing.sites import Site

FORMAT = "pmap_compat.testing.calls/1"
CALLS_DIR = "calls"
INDEX = "sites.json"
DEFAULT_CALLS = 3
DEFAULT_MAX_BYTES = 2 ** 30
STEPPED = "stepped"  # a call's outputs with its loops stepped (loop_records)


@dataclasses.dataclass
class Stepped:
  """A call run again with its loops stepped: each iteration's carry, and its outputs."""
  iterations: loop_records.IterationRecorder
  outputs: tuple[dict, list[recordings.Leaf]]


class TooLarge(ValueError):
  """Storing one more call would pass the size cap."""


@dataclasses.dataclass
class SiteEntry:
  key: str
  module: str
  qualname: str
  file: str | None
  line: int | None
  calls: int = 0  # how often the program called it (top-level calls)
  recorded: int = 0  # how many of the first calls are stored
  directory: str = ""

  @classmethod
  def of(cls, site: Site, directory: str) -> SiteEntry:
    return cls(site.key, site.module, site.qualname, site.file, site.line, directory=directory)

  @property
  def where(self) -> str:
    return f"{os.path.basename(self.file)}:{self.line}" if self.file and self.line else "?"


def host_leaves(tree: Any) -> tuple[dict, list[recordings.Leaf]]:
  """A call's inputs or outputs on the host, copied (donation may reuse the buffers)."""
  structure, flat = trees.describe(tree)
  leaves = []
  for path, x in flat:
    leaf = recordings.to_leaf(path, x, opaque=True)
    if isinstance(leaf.value, np.ndarray):
      leaf.value = np.array(leaf.value, copy=True)
    leaves.append(leaf)
  return structure, leaves


def keywords_by_position(recorded: recordings.Recording,
                         fun: Any) -> recordings.Recording | None:
  """Recorded inputs `(args, kwargs)` with the keyword arguments moved to `fun`'s
  positions for them, as the plain form's `placed_on` passes them (shard_map takes no
  keywords); None where there are none, or they do not follow the positional ones."""
  children: list[dict] = recorded.tree.get("children") or []
  if len(children) != 2 or children[1].get("type") != "dict" or not children[1].get("keys"):
    return None
  args, kwargs = children
  if args.get("type") != "tuple":
    return None
  try:
    parameters = [p.name for p in inspect.signature(fun).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  except (TypeError, ValueError):  # no signature to read
    return None
  given = len(args["children"])
  names = parameters[given:given + len(kwargs["keys"])]
  if sorted(names) != sorted(kwargs["keys"], key=str):
    return None
  node = dict(zip(kwargs["keys"], kwargs["children"], strict=True))
  tree = {"type": "tuple", "children": [
      {"type": "tuple", "children": args["children"] + [node[name] for name in names]},
      {"type": "dict", "keys": [], "children": []}]}
  # A keyword argument's path -> its position.
  position = {f"[1][{name!r}]": given + i for i, name in enumerate(names)}

  def moved(leaf: recordings.Leaf) -> tuple[int, recordings.Leaf]:
    for old, index in position.items():
      if leaf.path.startswith(old):
        return index, dataclasses.replace(leaf, path=f"[0][{index}]" + leaf.path[len(old):])
    return -1, leaf  # a positional argument's: first, in its order
  # JAX's flattening order: the arguments' leaves in the order of their positions.
  ordered = sorted((moved(leaf) for leaf in recorded.leaves), key=lambda pair: pair[0])
  return dataclasses.replace(recorded, tree=tree, leaves=[leaf for _, leaf in ordered])


class Writer:
  """Stores calls as they happen, in a staging directory moved into place by `save`."""

  def __init__(self, calls_per_site: int, max_bytes: int, near: str):
    if calls_per_site < 0:
      raise ValueError(f"calls: expected a number of calls >= 0, got {calls_per_site}")
    self.calls_per_site = calls_per_site
    self.max_bytes = max_bytes
    parent = os.path.dirname(os.path.abspath(near))
    os.makedirs(parent, exist_ok=True)
    self._staging = tempfile.mkdtemp(prefix=".calls-", dir=parent)
    self.sites: dict[str, SiteEntry] = {}
    self.bytes = 0
    self.stepped_calls = 0  # stored calls whose loops were stepped
    self.iterations = 0  # loop iterations stored, over all calls

  def called(self, site: Site) -> tuple[SiteEntry, int]:
    """Counts a call; returns the site's entry and this call's index."""
    entry = self.sites.get(site.key)
    if entry is None:
      entry = self.sites[site.key] = SiteEntry.of(site, f"site_{len(self.sites):03d}")
    entry.calls += 1
    return entry, entry.calls - 1

  def store(self, entry: SiteEntry, index: int, inputs: tuple[dict, list[recordings.Leaf]],
            outputs: tuple[dict, list[recordings.Leaf]],
            stepped: Stepped | None = None) -> None:
    """Stores one call; `stepped`: its loop iterations and the outputs it gave with them."""
    parts = {"inputs": inputs, "outputs": outputs}
    if stepped is not None:
      parts[STEPPED] = stepped.outputs
    size = sum(recordings.stored_bytes(leaves, dedupe=True) for _, leaves in parts.values())
    loops = " (its loop iterations included)" if stepped is not None else ""
    remedies = "raise the cap, or store fewer calls per site with --calls" + (
        ", or store calls whole with --no-loop-steps" if stepped is not None else "")
    if stepped is not None and stepped.iterations.overflowed:
      raise TooLarge(
          f"recording call {index} of pmap site {entry.key} ({entry.where}): its loop "
          f"iterations alone pass the cap of {self.max_bytes:,} bytes (--max-call-bytes / "
          f"max_call_bytes), less the {self.bytes:,} already stored: {remedies}")
    size += stepped.iterations.bytes if stepped is not None else 0
    if self.bytes + size > self.max_bytes:
      raise TooLarge(
          f"recording call {index} of pmap site {entry.key} ({entry.where}){loops} would "
          f"bring the stored calls to {self.bytes + size:,} bytes, over the cap of "
          f"{self.max_bytes:,} (--max-call-bytes / max_call_bytes): {remedies}")
    call_dir = os.path.join(self._staging, entry.directory, f"call_{index:05d}")
    producer = {"jax": jax.__version__, "site": entry.key, "call": index}
    for part, (structure, leaves) in parts.items():
      recordings.write_leaves(os.path.join(call_dir, part), structure, leaves, producer,
                              dedupe=True)
    if stepped is not None:
      stepped.iterations.write(call_dir)
      self.stepped_calls += 1
      self.iterations += stepped.iterations.iterations
    self.bytes += size
    entry.recorded = index + 1

  def save(self, recording_dir: str) -> str:
    """Moves the stored calls into `recording_dir`/calls (replacing what is there)."""
    index = {"format": FORMAT, "calls_per_site": self.calls_per_site,
             "max_bytes": self.max_bytes, "bytes": self.bytes,
             "sites": [dataclasses.asdict(e) for e in self.sites.values()]}
    with open(os.path.join(self._staging, INDEX), "w", encoding="utf-8") as f:
      json.dump(index, f, indent=1)
    target = os.path.join(recording_dir, CALLS_DIR)
    if os.path.exists(target):
      shutil.rmtree(target)
    os.replace(self._staging, target)
    return target

  def discard(self) -> None:
    shutil.rmtree(self._staging, ignore_errors=True)


@dataclasses.dataclass
class Stored:
  """A recording's per-call part, as read back."""
  directory: str
  calls_per_site: int
  sites: dict[str, SiteEntry]
  bytes: int

  def _call_dir(self, entry: SiteEntry, index: int) -> str:
    return os.path.join(self.directory, entry.directory, f"call_{index:05d}")

  def call(self, entry: SiteEntry, index: int) -> tuple[recordings.Recording,
                                                        recordings.Recording]:
    """The recorded (inputs, outputs) of one call."""
    call_dir = self._call_dir(entry, index)
    return (recordings.read(os.path.join(call_dir, "inputs")),
            recordings.read(os.path.join(call_dir, "outputs")))

  def stepped(self, entry: SiteEntry, index: int) -> tuple[loop_records.RecordedIterations,
                                                           recordings.Recording] | None:
    """The recorded loop iterations of one call and the outputs it gave with them; None
    when the call held no loop."""
    call_dir = self._call_dir(entry, index)
    iterations = loop_records.read(call_dir)
    if iterations is None:
      return None
    return iterations, recordings.read(os.path.join(call_dir, STEPPED))


def read(recording_dir: str) -> Stored:
  """The per-call part of a recording; FileNotFoundError names the option that makes one."""
  directory = os.path.join(recording_dir, CALLS_DIR)
  path = os.path.join(directory, INDEX)
  if not os.path.exists(path):
    raise FileNotFoundError(
        f"{recording_dir} holds no per-call recording ({CALLS_DIR}/{INDEX} is missing): "
        "record it again with this version's `record` (--calls K, K >= 1)")
  with open(path, encoding="utf-8") as f:
    index = json.load(f)
  if index.get("format") != FORMAT:
    raise ValueError(f"{path} is not a {FORMAT} index (format {index.get('format')!r})")
  sites = {s["key"]: SiteEntry(**s) for s in index["sites"]}
  return Stored(directory, index["calls_per_site"], sites, index["bytes"])
