"""Shared test machinery: the host-device guard, the legacy-pmap comparison helper and
legacy's recorded results, the JAX-line markers, and the other JAX environments."""
