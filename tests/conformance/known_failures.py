"""The cases of JAX's own suites that JAX's implementation passes and ours does not yet.

KNOWN_FAILURES[(release, suite)][case]: a real failure, to be fixed in shard_map_impl or
pmap_compat; the tier fails as soon as one of them passes (strict), so fixed cases leave
the list. NOT_APPLICABLE[suite][case]: a case about JAX's internals rather than anything
a user can see, with the reason; these never count. Cases are `Class::test_name`.
"""
from __future__ import annotations

# Each reason names the mechanism; the cases that share one belong to one fix.
_DCE = ("known failure: test_dce counts the equations of every sub-jaxpr, and ours' "
        "shard_map equation also holds its device-witness sub-jaxpr (one sharding_constraint "
        "telling jit the mesh's devices): one equation over JAX's count")

KNOWN_FAILURES: dict[tuple[str, str], dict[str, str]] = {
  ("0.6.0", "shard_map"): {
    "ShardMapTest::test_dce": _DCE,
  },
  ("0.6.0", "pmap"): {
    **dict.fromkeys(
      [f"{c}::testNestedWithClosure_mesh=(1,1)" for c in ("PythonPmapEagerTest",
                                                           "CppPmapEagerTest")],
      "known failure: under disable_jit, a nested pmap over a 1x1 device mesh whose inner "
      "function closes over an outer-mapped value places that value on the outer one-axis "
      "mesh where the nested call expects the ('i', 'j') mesh ('Mesh shape of the input "
      "... does not match the mesh shape of the target sharding')"),
    **dict.fromkeys(
      [f"{c}::testJitOfPmapLowerHasReplicaAttributes" for c in ("PythonPmapTest",
                                                                "CppPmapTest")],
      "known failure: jit of pmap_compat.pmap lowers to one SPMD program over partitions "
      "(mhlo.num_partitions = 2, num_replicas = 1) where legacy pmap lowers to replicas "
      "(mhlo.num_replicas = 2); the values agree, the lowered module's attributes do not"),
  },
  ("0.10.2", "shard_map"): {
    "ShardMapTest::test_dce": _DCE,
  },
  ("0.10.2", "pmap"): {
    "PmapWithDevicesTest::testNoDevicesError": (
        "known failure: pmap_compat.pmap(f, devices=[]) is built without error and raises "
        "when applied, as legacy pmap did (the 0.6.0 suite builds it outside its "
        "expected-error block), where 0.10.2's jax.pmap raises \"'devices' argument to "
        "pmap must be non-empty\" when built"),
    "PythonPmapTest::testLowerCompileArgTypeMismatch": (
        "known failure: calling a compiled pmap with other argument types names the "
        "argument by its parameter ('x'), as legacy pmap's message does, where 0.10.2's "
        "jax.pmap, which the test's pattern follows, names its own internal 'flat_args[0]'"),
  },
}

NOT_APPLICABLE: dict[str, dict[str, str]] = {
  "shard_map": {},
  "pmap": {},
}
