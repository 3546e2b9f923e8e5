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
_VMAP_EXPLICIT = ("known failure: vmap over Explicit mesh axes (spmd_axis_name or an "
                  "Explicit-sharded batch dimension): ours' batching rule drops the batch "
                  "axis's mesh axes from the specs, so results lose that sharding "
                  "(P(None, 'y') for P(('z', 'x'), 'y')) or the in_specs check rejects "
                  "the input")
_PARTIAL_EXPLICIT = ("known failure: partially manual over Explicit axes, ours types the "
                     "body's arguments without the Explicit axes left auto (P(None, None) "
                     "where JAX keeps P(None, 'y') / P('x', None))")

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
    "ShardMapTest::test_vmap_explicit_mesh_axis": _VMAP_EXPLICIT,
    "ShardMapTest::test_vmap_explicit_mesh_axis_single_axis": _VMAP_EXPLICIT,
    "ShardMapTest::test_vmap_shmap_psum": _VMAP_EXPLICIT,
    "ShardMapTest::test_explicit_vmap_grad_shmap_no_axis_name": (
        "known failure: vmap (no axis name) of grad through ours over an Explicit mesh "
        "stages a reduce_sum whose result is typed f32[6] for a binder of f32[6@x] "
        "(JaxprTypeError): the batched transpose loses the Explicit sharding"),
    "ShardMapTest::test_partial_manual_explicit_shmap0": _PARTIAL_EXPLICIT,
    "ShardMapTest::test_partial_manual_explicit_shmap1": _PARTIAL_EXPLICIT,
    "ShardMapTest::test_partial_auto_mismatch_mesh_error": (
        "known failure: a shard_map over the whole mesh nested in a partially manual one "
        "runs where JAX raises 'context mesh ... should match the mesh passed to "
        "shard_map' (ours does not compare the nested mesh with the context mesh)"),
    "ShardMapTest::test_eager_shmap_new_ref": (
        "known failure: eager calls of ours do not take mutable refs (jax.new_ref) as "
        "arguments: the per-device avals are built from a ShapedArray where JAX reads the "
        "ref's inner_aval"),
    "ShardMapTest::test_pure_callback_return_multiple_arrays": (
        "known failure: pure_callback with several results in ours under an Explicit "
        "context mesh mixes that mesh with an Auto copy of it ('mesh should be the same "
        "across the entire program')"),
    "ShardMapTest::test_shmap_empty_mesh_error": (
        "known failure: an empty mesh is not rejected first: ours raises its in_specs "
        "axis error where JAX raises 'shard_map requires a non-empty mesh'"),
    "ShardMapTest::test_different_devices_shmap_abstract_mesh_cache_hit": (
        "known failure: ours stages its body outside the tracing cache that "
        "jtu.count_jit_tracing_cache_miss counts (1 miss where JAX's shard_map makes 2: "
        "jit's and the body's), so the test's cache-hit accounting differs"),
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
