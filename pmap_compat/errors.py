"""Error messages worded like legacy ``jax.pmap``'s, plus the checks of pmap's own arguments."""
from __future__ import annotations

import collections
import inspect
from typing import Any
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax._src import core
from jax._src.interpreters import partial_eval as pe
from jax.tree_util import keystr, tree_flatten_with_path, tree_leaves

from pmap_compat import jax_line


def check_axes_spec(spec: Any, which: str) -> None:
  """``in_axes``/``out_axes`` must be ints / None in a container (legacy TypeError)."""
  bad = [leaf for leaf in tree_leaves(spec) if type(leaf) is not int]
  if bad:
    raise TypeError(f"pmap {which} must be an int, None, or (nested) container "
                    f"with those types as leaves, but got {spec}.")


def check_devices(devices: Sequence[Any] | None) -> tuple | None:
  """Duplicates would silently break the device mapping. An empty list is rejected
  where the release's own pmap rejects it: when the function is called under legacy's
  runtime (``no_devices``), when pmap is applied where legacy is gone."""
  if devices is None:
    return None
  devices = tuple(devices)
  if not devices and not jax_line.LEGACY_PMAP_RUNTIME:
    raise no_devices()
  seen: dict[int, Any] = {}
  repeated = []
  for d in devices:
    if d.id in seen and d not in repeated:
      repeated.append(d)
    seen[d.id] = d
  if repeated:
    raise ValueError(
        f"'devices' argument to pmap lists the same device more than once: "
        f"{', '.join(str(d) for d in repeated)}. Each mapped position needs its own device; "
        f"pass {len(seen)} distinct devices.")
  return devices


def no_devices() -> ValueError:
  return ValueError("'devices' argument to pmap must be non-empty, or None.")


def global_arg_shapes_removed() -> ValueError:
  return ValueError(
      "global_arg_shapes only worked with sharded_jit which has long been"
      " removed from JAX. Please migrate to pjit and remove global_arg_shapes"
      " from pmap.")


def no_arguments(args: tuple, kwargs: dict) -> ValueError:
  return ValueError(
      "pmap wrapped function must be passed at least one argument "
      f"containing an array, got empty *args={args} and **kwargs={kwargs}")


def rank_too_small(axis: int, shape: tuple) -> ValueError:
  need = axis + 1 if axis >= 0 else -axis
  return ValueError(
      f"pmap was requested to map its argument along axis {axis}, "
      f"which implies that its rank should be at least {need}, "
      f"but is only {len(shape)} (its shape is {shape})")


def nothing_mapped() -> ValueError:
  return ValueError("pmap must have at least one non-None value in in_axes")


def axis_size_mismatch(given: int, found: int) -> ValueError:
  return ValueError(f"Specified axis_size {given} doesn't match received axis_size {found}.")


def axis_size_not_positive(given: int) -> ValueError:
  """Every in_axes None (our extension): ``axis_size`` alone gives the mapped size."""
  return ValueError(f"pmap axis_size must be at least 1 when every in_axes is None, "
                    f"got axis_size={given}")


def devices_mismatch(size: int, devices: Sequence[Any]) -> ValueError:
  names = ", ".join(str(d) for d in devices)
  return ValueError(
      "Leading axis size of input to pmapped function must equal the number of local "
      f"devices passed to pmap. Got axis_size={size}, num_local_devices={len(devices)}.\n"
      f"(Local devices available to pmap: {names})")


def nested_devices_mismatch(needed: int, size: int, devices: Sequence[Any]) -> ValueError:
  """``devices=`` given, but the outer pmap and the pmaps nested in it need ``needed``."""
  if needed == size:
    return devices_mismatch(size, devices)
  names = ", ".join(str(d) for d in devices)
  return ValueError(
      f"pmapped function requires {needed} local devices to run due to nested pmapped or "
      f"other parallel functions, but only {len(devices)} are available.\n"
      f"(outer axis size: {size}, local devices available to pmap: {names})")


class TooManyDevices(ValueError):
  """The mapped size (times nested pmaps') exceeds the devices there are; worded as
  legacy's top-level pmap words it (``in_jit`` for a pmap staged into a user's jit)."""

  def __init__(self, needed: int, available: int):
    super().__init__(
        f"compiling computation that requires {needed} logical devices, but only "
        f"{available} XLA devices are available (num_replicas={needed})")
    self.needed, self.available = needed, available

  def in_jit(self) -> ValueError:
    """Legacy's error for a jit containing this pmap: it names that jit's computation
    (the outermost one the trace stack shows)."""
    name = next(reversed(_enclosing_jit_names()), None)
    if name is None:
      return self
    return ValueError(f"compiling computation `{name}` that requires {self.needed} replicas, "
                      f"but only {self.available} XLA devices are available.")


def _enclosing_jit_names() -> list[str]:
  """The functions whose jaxprs are being staged around this point, innermost first."""
  names = []
  trace = core.trace_ctx.trace
  while trace is not None:
    # jax 0.10 types a frame's debug info as optional (its traces always set one).
    if isinstance(trace, pe.DynamicJaxprTrace) and trace.frame.debug_info is not None:
      names.append(trace.frame.debug_info.func_name)
    trace = getattr(trace, "parent_trace", None)  # jax 0.6's jit traces have none
  return names


def too_many_devices(needed: int, available: int) -> TooManyDevices:
  return TooManyDevices(needed, available)


def static_args_missing(static: tuple, nargs: int) -> ValueError:
  plural = "s" if nargs > 1 else ""
  return ValueError(
      f"pmapped function has static_broadcasted_argnums={static} but was called with only "
      f"{nargs} positional argument{plural}. All static broadcasted arguments must be "
      "passed positionally.")


_DOCS = "https://docs.jax.dev/en/latest/_autosummary/jax.pmap.html#jax.pmap"


class InAxesMismatch(ValueError):
  """``in_axes`` is not a prefix of the arguments: found before the user's function runs,
  and worded from the arguments' own types (so re-checked on the concrete arguments when
  it is first found on jit's tracers)."""


def in_axes_not_prefix(has_kwargs: bool, detail: str) -> ValueError:
  """``detail`` is the pytree mismatch description; the rest is legacy's explanation."""
  parts = [detail,
           "The 'full pytree' here is the tuple of arguments passed positionally to the "
           "pmapped function, and the value of `in_axes` must be a tree prefix of that tuple. "
           "But it was not a prefix."]
  if has_kwargs:
    parts.append("When some arguments are passed by keyword to the pmapped function, they are "
                 "not included in the comparison to `in_axes`. Instead, each argument passed by "
                 "keyword is mapped over its leading axis. See the description of `in_axes` in "
                 f"the `pmap` docstring: {_DOCS}")
  parts.append("Check that the value of the `in_axes` argument to `pmap` is a tree prefix of the "
               "tuple of arguments passed positionally to the pmapped function.")
  return InAxesMismatch("\n\n".join(parts))


def out_axes_not_prefix(detail: str) -> ValueError:
  return ValueError(
      f"{detail}\n\nThe full pytree is the output of the pmapped function. Ensure that the "
      "`out_axes` argument to `pmap` is a pytree prefix of the pmapped function's output.")


def _arg_label(fun: Callable, path: tuple, n_positional: int) -> str:
  """'argument x[0]' when fun's signature names the argument, else 'args[0][0]'."""
  try:
    params = list(inspect.signature(fun).parameters)
  except (TypeError, ValueError):
    params = None
  head, rest = path[0], path[1:]
  idx = getattr(head, "idx", None)
  if params is None or idx is None or idx >= len(params) or idx >= n_positional:
    return f"args{keystr(path)}"
  label = f"argument {params[idx]}"
  return label + keystr(rest) if rest else label


def _type_str(x: Any) -> str:
  try:
    return jax.typeof(x).str_short()
  except TypeError:
    return "unknown"


def _labelled_leaves(fun: Callable, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
  """(label as legacy's messages write it, leaf) for each leaf of ``(args, kwargs)``."""
  labelled = [(_arg_label(fun, p, len(args)), x)
              for p, x in tree_flatten_with_path(args)[0]]
  return labelled + [(f"kwargs{keystr(p)}", x) for p, x in tree_flatten_with_path(kwargs)[0]]


def inconsistent_sizes(fun: Callable, args: tuple, kwargs: dict,
                       axes: Sequence[int | None]) -> ValueError:
  """Lists which arguments disagree on the mapped size, like legacy pmap does."""
  labelled = _labelled_leaves(fun, args, kwargs)
  sizes = [None if d is None else np.shape(x)[d] for (_, x), d in zip(labelled, axes, strict=True)]
  first_at: dict[int, int] = {}
  for i, s in enumerate(sizes):
    if s is not None:
      first_at.setdefault(s, i)
  counts = collections.Counter(s for s in sizes if s is not None).most_common()
  lines = ["pmap got inconsistent sizes for array axes to be mapped:"]
  for rank, (size, count) in enumerate(counts):
    i = first_at[size]
    where = f"axis {axes[i]} of {labelled[i][0]} of type {_type_str(labelled[i][1])}"
    if count == 1:
      lines.append(f"  * one axis had size {size}: {where}")
    else:
      many = "most" if rank == 0 else "some"
      lines.append(f"  * {many} axes ({count} of them) had size {size}, e.g. {where}")
  return ValueError(lines[0] + "\n" + ";\n".join(lines[1:]))


def empty_mapped_axis(fun: Callable, args: tuple, kwargs: dict,
                      axes: Sequence[int | None]) -> ValueError:
  """The mapped axis has size 0: names the first argument mapped along an empty axis."""
  labelled = _labelled_leaves(fun, args, kwargs)
  label, x, axis = next((label, x, d) for (label, x), d in zip(labelled, axes, strict=True)
                        if d is not None and np.shape(x)[d] == 0)
  return ValueError(
      f"pmap cannot map over an axis of size 0: axis {axis} of {label} of type "
      f"{_type_str(x)} is empty. Each position along the mapped axis runs on its own "
      "device, so the mapped axis needs at least one element.")


def not_a_jax_type(x: Any) -> TypeError:
  return TypeError(f"Argument '{x}' of type {type(x)} is not a valid JAX type.")


def jit_refused_argument(err: Exception) -> bool:
  """Is ``err`` jit's refusal of a value that is not a JAX type, raised before tracing?"""
  return isinstance(err, TypeError) and str(err).startswith("Error interpreting argument")


def check_jax_types(leaves: Sequence[Any]) -> None:
  """Legacy's error for the first argument leaf that is no JAX value (an object-dtype
  array, a string); called once something else has refused the leaves."""
  for x in leaves:
    if not isinstance(x, core.Tracer) and not core.valid_jaxtype(x):
      raise not_a_jax_type(x)


_X64_HINT = ("Perhaps you are calling the compiled executable with a different enable_x64 "
             "mode than when it was AOT compiled? ")


def as_legacy_type_mismatch(err: TypeError) -> TypeError:
  """jit's error for a compiled program called with other argument types, worded as
  legacy's (jax 0.10 inserts a hint about x64 mode); any other TypeError unchanged."""
  message = str(err)
  if _X64_HINT not in message:
    return err
  return TypeError(message.replace(_X64_HINT, ""))


def invalid_value(kind: str) -> FloatingPointError:
  """``jax_debug_nans`` / ``jax_debug_infs`` found ``kind`` ("nan" / "inf") in a result."""
  return FloatingPointError(f"Invalid value ({kind}) encountered in parallel computation.")


def replicated_output_varies(paths: Sequence[str]) -> ValueError:
  return ValueError(
      "pmap out_axes=None promises a value that is the same on every device, but these "
      f"outputs differ between devices: {', '.join(paths)}. Use out_axes=0 to keep the "
      "per-device values, or reduce them (e.g. lax.pmean) before returning.")
