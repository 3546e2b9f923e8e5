"""Integration points and coexistence with JAX's own shard_map (reference.py).

* jit device assignment from our mesh for uncommitted inputs,
* checkify and key-reuse checking of our primitive,
* importing shard_map_impl leaves every JAX rule table entry keyed by JAX's
  own objects, and every JAX trace class, untouched; both shard_maps run in
  one program.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
sys.path.insert(0, ROOT)

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src import dispatch
from jax.experimental import checkify
from jax.sharding import NamedSharding, PartitionSpec as P

import shard_map_impl
from reference import jax_shard_map
from support.meshes import make_mesh
from support.compare import assert_trees_equal

IMPLS = {"jax": jax_shard_map, "ours": shard_map_impl.shard_map}


def both(build):
  return {k: build(sm) for k, sm in IMPLS.items()}


def test_uncommitted_inputs_get_mesh_devices():
  mesh = make_mesh((4, 2))
  x = jnp.arange(16.0).reshape(8, 2)  # uncommitted, on the default device
  outs = both(lambda sm: jax.jit(sm(lambda v: jax.lax.psum(v, "x"), mesh,
                                    in_specs=P("x", "y"), out_specs=P(None, "y")))(x))
  assert_trees_equal(outs["jax"], outs["ours"])
  assert outs["ours"].sharding.device_set == set(mesh.devices.flat)
  assert outs["ours"].sharding == outs["jax"].sharding


def test_intermediate_shardings_name_our_mesh():
  mesh = make_mesh((8,))
  f = shard_map_impl.shard_map(jnp.sin, mesh, in_specs=P("x"), out_specs=P("x"))
  jaxpr = jax.make_jaxpr(f)(np.ones(8, np.float32)).jaxpr
  found = {s.mesh for s, _ in dispatch.get_intermediate_shardings(jaxpr)
           if isinstance(s, NamedSharding)}
  assert found == {mesh}


def test_numpy_inputs_inside_outer_jit_ops():
  mesh = make_mesh((2, 2, 2))
  def program(sm):
    g = sm(lambda v: v * jax.lax.axis_index("z"), mesh, in_specs=P(("x", "y", "z")),
           out_specs=P(("x", "y", "z")))
    return jax.jit(lambda v: g(v + 1).sum())(np.arange(16.0, dtype=np.float32))
  outs = both(program)
  assert_trees_equal(outs["jax"], outs["ours"])


@pytest.mark.parametrize("use_jit", [False, True])
def test_checkify_user_check(use_jit):
  mesh = make_mesh((4, 2))
  def program(sm):
    def body(x):
      checkify.check(jnp.all(x < 5), "too big: {}", x.sum())
      return x * 2
    f = checkify.checkify(sm(body, mesh, in_specs=P("x"), out_specs=P("x")))
    f = jax.jit(f) if use_jit else f
    err, out = f(np.arange(8.0, dtype=np.float32))
    return err.get(), out
  outs = both(program)
  assert outs["jax"][0] == outs["ours"][0] and outs["jax"][0] is not None
  assert_trees_equal(outs["jax"][1], outs["ours"][1])


def test_checkify_float_checks():
  mesh = make_mesh((8,))
  def program(sm):
    f = sm(lambda x: jnp.log(x - 3), mesh, in_specs=P("x"), out_specs=P("x"))
    err, _ = jax.jit(checkify.checkify(f, errors=checkify.float_checks))(
        np.arange(8.0, dtype=np.float32))
    return err.get()
  outs = both(program)
  assert outs["jax"] == outs["ours"] and "nan generated" in outs["ours"]


def test_key_reuse_detected_inside():
  mesh = make_mesh((8,))
  def program(sm):
    f = sm(lambda k: jax.random.uniform(k) + jax.random.uniform(k), mesh,
           in_specs=P(), out_specs=P())
    with jax.debug_key_reuse(True):
      jax.jit(f)(jax.random.key(0))
  errors = {}
  for name, sm in IMPLS.items():
    with pytest.raises(Exception) as info:
      program(sm)
    errors[name] = info.value
  assert type(errors["ours"]) is type(errors["jax"])
  assert "KeyReuseError" in type(errors["ours"]).__name__


def test_both_shard_maps_in_one_program():
  mesh = make_mesh((4, 2))
  ours = shard_map_impl.shard_map(lambda v: jax.lax.psum(v, "y"), mesh,
                                  in_specs=P("x", "y"), out_specs=P("x"))
  theirs = jax_shard_map(lambda v: jax.lax.psum(v, "x"), mesh, in_specs=P("x"),
                         out_specs=P())
  x = np.arange(32.0, dtype=np.float32).reshape(8, 4)
  mixed = jax.jit(lambda v: theirs(ours(v)))(x)
  reference = jax.jit(lambda v: theirs(jax_shard_map(
      lambda w: jax.lax.psum(w, "y"), mesh, in_specs=P("x", "y"), out_specs=P("x"))(v)))(x)
  assert_trees_equal(reference, mixed)
  # and legacy pmap still works alongside both
  xs = np.arange(8.0, dtype=np.float32)
  assert_trees_equal(jax.pmap(lambda v: v * 2)(xs), xs * 2)


_SNAPSHOT = textwrap.dedent("""
  import os, sys
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  sys.path.insert(0, {root!r})
  import jax
  from jax._src import core, checkify, dispatch
  from jax._src.interpreters import ad, batching, mlir, partial_eval as pe, pxla
  try:  # JAX's shard_map module: 0.6 experimental, 0.10 internal
    from jax.experimental.shard_map import shard_map_p as _
    from jax.experimental import shard_map as jsm
  except ImportError:
    from jax._src import shard_map as jsm
  from jax.experimental.key_reuse import _core as kr

  tables = {{
    "mlir._lowerings": mlir._lowerings,
    "mlir._platform_specific_lowerings": mlir._platform_specific_lowerings,
    "ad.primitive_jvps": ad.primitive_jvps,
    "ad.primitive_transposes": ad.primitive_transposes,
    "batching.primitive_batchers": batching.primitive_batchers,
    "batching.fancy_primitive_batchers": batching.fancy_primitive_batchers,
    "pe.custom_staging_rules": pe.custom_staging_rules,
    "pe.partial_eval_jaxpr_custom_rules": pe.partial_eval_jaxpr_custom_rules,
    "pe.dce_rules": pe.dce_rules,
    "pe.padding_rules": getattr(pe, "padding_rules", {{}}),
    "core.custom_typechecks": core.custom_typechecks,
    "core.pp_eqn_rules": core.pp_eqn_rules,
    "core.shard_aval_handlers": core.shard_aval_handlers,
    "core.unshard_aval_handlers": core.unshard_aval_handlers,
    "checkify.error_checks": checkify.error_checks,
    "key_reuse_signatures": kr.key_reuse_signatures,
  }}
  def snap_tables():
    out = {{}}
    for name, t in tables.items():
      if not isinstance(t, dict):
        continue  # a write-only proxy (0.10's primitive_batchers) of a table listed too
      for plat_or_key, v in list(t.items()):
        out[(name, id(plat_or_key))] = (plat_or_key, v if not isinstance(v, dict) else dict(v))
    return out
  def all_subclasses(k):
    seen, todo = set(), [k]
    while todo:
      c = todo.pop()
      for s in c.__subclasses__():
        if s not in seen:
          seen.add(s); todo.append(s)
    return seen
  classes = [c for c in all_subclasses(core.Trace) | all_subclasses(core.Tracer)
             | {{core.Primitive, type(jsm.shard_map_p)}} if c.__module__.startswith("jax")]
  before_tables = snap_tables()
  before_classes = {{c: dict(vars(c)) for c in classes}}
  jsm_before = dict(vars(jsm))

  import shard_map_impl

  after = snap_tables()
  problems = []
  for key, (k, v) in before_tables.items():
    if key not in after:
      problems.append(f"removed {{key[0]}}[{{k}}]")
    elif after[key][1] is not v and after[key][1] != v:
      problems.append(f"changed {{key[0]}}[{{k}}]")
  for key, (k, v) in after.items():
    if key not in before_tables and k is not shard_map_impl.shard_map_p:
      if getattr(k, "__module__", "").startswith("shard_map_impl") or \\
         type(k).__module__.startswith("shard_map_impl"):
        continue  # keyed by our own objects
      problems.append(f"added {{key[0]}}[{{k}}] (not our primitive)")
  for c, attrs in before_classes.items():
    now = dict(vars(c))
    for name in set(attrs) | set(now):
      if attrs.get(name, None) is not now.get(name, None):
        problems.append(f"class {{c.__qualname__}}.{{name}} changed")
  if dict(vars(jsm)) != jsm_before:
    problems.append("JAX's shard_map module changed")
  print("PROBLEMS", problems)
""")


def test_import_changes_nothing_in_jax():
  code = _SNAPSHOT.format(root=ROOT)
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith("PROBLEMS")][-1]
  assert line == "PROBLEMS []", line
