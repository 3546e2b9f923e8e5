"""The cases of JAX's own suites that JAX's implementation passes and ours does not yet.

KNOWN_FAILURES[(release, suite)][case]: a real failure, to be fixed in shard_map_impl or
pmap_compat; the tier fails as soon as one of them passes (strict), so fixed cases leave
the list. NOT_APPLICABLE[(release, suite)][case]: a case about JAX's implementation
rather than anything pmap_compat promises, with the reason; these never count. Release
EVERY holds what applies on each release that has the case. Cases are `Class::test_name`;
`known_failures` and `not_applicable` give one release's entries.
"""
from __future__ import annotations

EVERY = "every release"

# Each reason names the mechanism; the cases that share one belong to one fix.
_DCE = ("known failure: test_dce counts the equations of every sub-jaxpr, and ours' "
        "shard_map equation also holds its device-witness sub-jaxpr (one sharding_constraint "
        "telling jit the mesh's devices): one equation over JAX's count")

KNOWN_FAILURES: dict[tuple[str, str], dict[str, str]] = {
  (EVERY, "shard_map"): {
    "ShardMapTest::test_dce": _DCE,
  },
}

# The argument name in the error of a compiled pmap called with other types is an artifact
# of each implementation: legacy's own on 0.7.2 gives '' and 0.10's jax.pmap its wrapper's
# own parameter ('flat_args[0]'); pmap_compat names the user's parameter ('x'), as legacy
# does on 0.6-0.7.0 and 0.8-0.9, and as the suites there expect.
_ARG_NAME = ("not applicable: the case pins the name this release's own pmap gives the "
             "argument in its message ({name}), where pmap_compat names the user's "
             "parameter ('x'), as legacy pmap does on the other releases")

NOT_APPLICABLE: dict[tuple[str, str], dict[str, str]] = {
  (EVERY, "pmap"): {
    **dict.fromkeys(
      [f"{c}::{t}" for c in ("PythonPmapTest", "CppPmapTest", "PythonPmapEagerTest",
                             "CppPmapEagerTest")
       for t in ("testLowerHasReplicaAttributes", "testJitOfPmapLowerHasReplicaAttributes")],
      "not applicable: the case reads the lowered module's attributes, how the program "
      "is laid out rather than what it computes: legacy pmap lowers to replicas "
      "(mhlo.num_replicas = N), pmap_compat, built on jit and shard_map, to one SPMD "
      "program over partitions (mhlo.num_partitions = N), as 0.10's own jax.pmap does; "
      "the values agree"),
    **dict.fromkeys(
      [f"{c}::testJitOfPmapWarningMessage" for c in ("PythonPmapTest", "CppPmapTest")],
      "not applicable: legacy warns that its jit of pmap gathers the arrays onto one "
      "device (its replica lowering); pmap_compat under jit is one SPMD program that "
      "keeps their shardings, so the warning would be untrue"),
  },
  ("0.7.2", "pmap"): {
    f"{c}::testLowerCompileArgTypeMismatch": _ARG_NAME.format(name="''")
    for c in ("PythonPmapTest", "CppPmapTest", "PythonPmapEagerTest", "CppPmapEagerTest")},
  **{(release, "pmap"): {
      "PythonPmapTest::testLowerCompileArgTypeMismatch": _ARG_NAME.format(
          name="'flat_args[0]'")}
     for release in ("0.10.0", "0.10.2")},
}


def known_failures(release: str, suite: str) -> dict[str, str]:
  return {**KNOWN_FAILURES.get((EVERY, suite), {}), **KNOWN_FAILURES.get((release, suite), {})}


def not_applicable(release: str, suite: str) -> dict[str, str]:
  return {**NOT_APPLICABLE.get((EVERY, suite), {}), **NOT_APPLICABLE.get((release, suite), {})}
