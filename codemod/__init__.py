"""codemod: libcst rewrites that move ``jax.pmap`` call sites onto ``jax.jit(shard_map(...))``.

Run it as ``python -m codemod.pmap_to_shmap PATH...`` or ``pmap-to-shmap PATH...``.
"""
