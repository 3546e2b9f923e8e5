"""Which JAX releases ``shard_map_impl`` and ``pmap_compat`` run on.

Both packages build on JAX internals (``jax._src.core``, ``partial_eval``, ``mlir``, ...)
that change between releases; ``jax_line`` asks the installed JAX what it has, one
capability at a time. What it cannot adapt is a JAX without varying-manual-axes types
(values typed by the mesh axes they vary over, ``core.pvary``): the replication check and
the efficient transpose are built on them. On such a JAX (0.5.3 and older) both packages
stop at import with this message, naming the nearest release they run on, instead of
failing deep inside JAX on a missing private name.
"""
from __future__ import annotations

import jax
from jax._src import core

# The releases pip serves for Python 3.11 on which the packages' suites were run.
TESTED = ("0.6.0", "0.6.2", "0.7.0", "0.7.2", "0.8.0", "0.8.2", "0.9.0", "0.9.2", "0.10.0",
          "0.10.2")
# The two the default suite runs on in full (`make test`); kept for pmap_compat.
SUPPORTED = (TESTED[0], TESTED[-1])
# The oldest release with varying-manual-axes types: the nearest one to any JAX without.
OLDEST = TESTED[0]


def has_varying_axes_types() -> bool:
  """Whether this JAX types per-device values by the manual axes they vary over."""
  return hasattr(core, "pvary")


def require_supported_jax() -> None:
  """Raises ImportError naming the nearest release it runs on where this JAX lacks
  varying-manual-axes types."""
  if not has_varying_axes_types():
    raise ImportError(
        f"shard_map_impl and pmap_compat need jax {OLDEST} or newer (tested on "
        f"{', '.join(TESTED)}): this is jax {jax.__version__}, whose values carry no "
        f"varying-manual-axes types (core.pvary), which the replication check and the "
        f"efficient transpose are built on. Install jax=={OLDEST} jaxlib=={OLDEST} (the "
        "nearest) or newer. pmap_compat.testing and the codemod's output run on jax "
        "0.4.35 to 0.10.2.")
