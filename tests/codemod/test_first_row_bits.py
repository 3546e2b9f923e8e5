"""The support module's ``first_row`` / ``first_rows`` keep every bit of row 0: -0.0, NaN
payloads (a signalling NaN's too) and subnormals, as legacy jax.pmap's ``x[0]`` does.

Legacy's ``x[0]`` reads device 0's buffer. On a NamedSharding array (a converted site's
output) plain ``x[0]`` is a select and an add across the devices (XLA's SPMD partitioner),
which turns -0.0 into +0.0, quiets a signalling NaN and flushes subnormals to zero;
``first_row`` reads row 0 from the buffer that holds it. The reference is legacy
jax.pmap's ``x[0]`` of the same rows on jax 0.6.0; on jax 0.10.2, where legacy is gone,
the rows themselves, which legacy's ``x[0]`` returns bit for bit (checked on 0.6.0 here).
"""
import inspect
import os
import textwrap

import jax
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from codemod_testing import load, rewrite, support
from support.jax_lines import requires
from support.venvs import NEWEST, ROOT, run_python

SUPPORT_SOURCE = os.path.join(ROOT, "codemod", "support_source.py")

# Row 0's bit patterns (device i's row: these rotated by i): -0.0, +0.0, quiet NaNs with
# payloads and either sign, a signalling NaN, -inf, the smallest negative and the largest
# subnormal.
F32 = (0x80000000, 0x00000000, 0x7FC00000, 0x7FC00001, 0xFFC00000, 0x7FFFFFFF, 0x7F800001,
       0xFF800000, 0x80000001, 0x007FFFFF)
BF16 = (0x8000, 0x0000, 0x7FC0, 0x7FC1, 0xFFC0, 0x7FFF, 0x7F81, 0xFF80, 0x8001, 0x007F)

LEGACY = requires("legacy_pmap", "legacy jax.pmap's x[0] is the reference")


def rows() -> dict:
  """Eight rows per dtype, row i the patterns rotated by i, so row 0 holds them all in order
  and every other row differs from it; complex64 pairs them (real, imaginary)."""
  def stacked(patterns, unsigned, dtype):
    return np.stack([np.roll(np.array(patterns, unsigned), i) for i in range(8)]).view(dtype)
  f32 = stacked(F32, np.uint32, np.float32)
  return {"f32": f32, "bf16": stacked(BF16, np.uint16, ml_dtypes.bfloat16),
          "c64": f32.view(np.complex64)}


def bits(x) -> list:
  """The elements' bits as unsigned integers (complex: real, imaginary, real, ...)."""
  x = np.asarray(x)
  if x.dtype.kind == "c":
    x = x.view(np.float32 if x.dtype == np.complex64 else np.float64)
  return x.view(np.dtype(f"uint{8 * x.dtype.itemsize}")).ravel().tolist()


def test_the_rows_hold_the_patterns():
  tree = rows()
  assert bits(tree["f32"][0]) == list(F32) and bits(tree["bf16"][0]) == list(BF16)
  assert bits(tree["c64"][0]) == list(F32)
  assert all(bits(tree["f32"][i]) != list(F32) for i in range(1, 8))


@LEGACY
def test_first_row_of_a_named_sharding_array_is_legacy_x0_bit_for_bit():
  tree = rows()
  legacy = jax.pmap(lambda t: t)(tree)  # legacy jax.pmap's output, and its x[0] below
  mesh = support().pmap_mesh(("i",), (8,))
  mapped = jax.device_put(tree, NamedSharding(mesh, PartitionSpec("i")))
  together = support().first_rows(mapped)
  for key in sorted(tree):
    reference = legacy[key][0]
    assert bits(reference) == bits(tree[key][0]), key  # legacy's x[0] keeps every bit
    for row in (support().first_row(mapped[key]), together[key]):
      assert (row.dtype, row.shape) == (reference.dtype, reference.shape), key
      assert bits(row) == bits(reference), (key, bits(row), bits(reference))


PROGRAM = textwrap.dedent("""
    import jax


    identity = jax.pmap(lambda t: t)


    def run(tree):
      out = identity(tree["f32"])
      everything = identity(tree)
      return out[0], jax.tree_util.tree_map(lambda x: x[0], everything)
""")


@LEGACY
def test_a_converted_program_returns_legacy_rows_bit_for_bit():
  """The codemod's output (first_row, first_rows) against the program under legacy pmap."""
  new, _ = rewrite(PROGRAM)
  assert "return first_row(out), first_rows(everything)" in new, new
  tree = rows()
  legacy = load(PROGRAM, "legacy_first_row_bits").run(tree)
  ours = load(new, "ours_first_row_bits").run(tree)
  assert jax.tree.structure(legacy) == jax.tree.structure(ours)
  for want, got in zip(jax.tree.leaves(legacy), jax.tree.leaves(ours), strict=True):
    assert want.dtype == got.dtype and bits(want) == bits(got), (bits(want), bits(got))
  assert bits(legacy[0]) == list(F32)


# Run in the jax 0.10.2 environment (argv[1]: the support module's source): first_row and
# first_rows of the same rows on a NamedSharding array against the rows themselves.
NEWEST_CHECK = """
import sys

import jax
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

F32, BF16 = {patterns}
{helpers}
support = {{}}
with open(sys.argv[1], encoding="utf-8") as f:
  exec(compile(f.read(), sys.argv[1], "exec"), support)
tree = rows()
mesh = support["pmap_mesh"](("i",), (8,))
mapped = jax.device_put(tree, NamedSharding(mesh, PartitionSpec("i")))
together = support["first_rows"](mapped)
for key in sorted(tree):
  for row in (support["first_row"](mapped[key]), together[key]):
    assert bits(row) == bits(tree[key][0]), (key, bits(row), bits(tree[key][0]))
print("ok")
"""


def test_first_row_keeps_every_bit_on_newest_jax(tmp_path):
  script = tmp_path / "check.py"
  script.write_text(NEWEST_CHECK.format(
      patterns=repr((F32, BF16)),
      helpers="\n\n".join(inspect.getsource(f) for f in (rows, bits))))
  proc = run_python(NEWEST, [str(script), SUPPORT_SOURCE])
  assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (
      proc.stdout + proc.stderr[-3000:])
