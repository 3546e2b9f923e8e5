"""Infinities, NaN payloads, signed zeros and subnormals in pmap_compat.testing's comparisons.

Identical non-finite values are identical at every scale (leaf scale, part scale). A NaN
with another payload, or a zero with the other sign, is "value-equal, bits differ": within
any tolerance that compares values, and named, and failing, where the tolerance is bit
for bit. A non-finite value that matches nothing (an infinity against a finite value or
the other infinity, NaN against a number) is beyond any tolerance, and an infinity never
sets the scale a finite difference is measured at. References: values are built from
their bit patterns, distances with np.nextafter, one ulp at a magnitude with np.spacing.
"""
import json
import textwrap

import ml_dtypes
import numpy as np
import pytest

from pmap_compat import testing
from pmap_compat.testing import calls, comparison, loop_records
from pmap_compat.testing.__main__ import main
from pmap_compat.testing.comparison import Tolerance
from pmap_compat.testing.loop_steps import Loop
from pmap_compat.testing.per_call import PER_CALL_MAX_ULP
from support.compare import assert_leaf_equal

# Bit patterns per dtype: +inf, -inf, NaNs with several payloads (quiet, quiet with a
# payload, negative, all payload bits), +0.0, -0.0, the smallest and largest subnormals.
PATTERNS = {
    np.float32: (np.uint32, (0x7F800000, 0xFF800000, 0x7FC00000, 0x7FC00001, 0xFFC00000,
                             0x7FFFFFFF, 0x00000000, 0x80000000, 0x00000001, 0x807FFFFF)),
    np.float64: (np.uint64, (0x7FF0000000000000, 0xFFF0000000000000, 0x7FF8000000000000,
                             0x7FF8000000000001, 0xFFF8000000000000, 0x7FFFFFFFFFFFFFFF,
                             0x0, 0x8000000000000000, 0x1, 0x800FFFFFFFFFFFFF)),
    ml_dtypes.bfloat16: (np.uint16, (0x7F80, 0xFF80, 0x7FC0, 0x7FC1, 0xFFC0, 0x7FFF, 0x0000,
                                     0x8000, 0x0001, 0x807F)),
}
# Pairs of float32 bit patterns equal as numbers, in other bits: (recorded, got, what).
EQUAL_PAIRS = [(0x7FC00000, 0x7FC00001, "1 NaN payload"), (0x7FC00000, 0xFFC00000, "1 NaN payload"),
               (0x7FC00001, 0x7FFFFFFF, "1 NaN payload"), (0x00000000, 0x80000000, "1 sign of zero"),
               (0x80000000, 0x00000000, "1 sign of zero")]
BIGGEST = np.finfo(np.float32).max
# Non-finite values that match nothing, as float32 (recorded, got).
UNMATCHED = [(np.inf, BIGGEST), (BIGGEST, np.inf), (np.inf, -np.inf), (-np.inf, -BIGGEST),
             (np.nan, 1.0), (1.0, np.nan), (np.nan, np.inf), (-np.inf, np.nan)]
CROSS = {"max_ulp": testing.CROSS_VERSION_MAX_ULP}  # a tolerance that compares values


def bits32(*patterns: int) -> np.ndarray:
  return np.array(patterns, np.uint32).view(np.float32)


def specials(dtype) -> np.ndarray:
  """Every special value of `dtype`, then some finite ones."""
  unsigned, patterns = PATTERNS[dtype]
  return np.concatenate([np.array(patterns, unsigned).view(dtype),
                         np.array([1.5, -3.0, 1e-3], dtype)])


def ulps_apart(x: np.float32, k: int) -> np.float32:
  for _ in range(k):
    x = np.nextafter(x, np.float32(np.inf), dtype=np.float32)
  return x


def with_element(x: np.ndarray, index: int, value) -> np.ndarray:
  y = x.copy()
  y[index] = value
  return y


# --------------------------------------------------------------------------- leaf scale


@pytest.mark.parametrize("dtype", list(PATTERNS), ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("tolerance", [{}, CROSS, {"rtol": 1e-3, "atol": 1e-6}],
                         ids=["bit-for-bit", "max-ulp", "rtol-atol"])
def test_identical_non_finite_values_are_identical(tmp_path, dtype, tolerance):
  x = specials(dtype)
  testing.record({"x": x, "scalar": x[:1].reshape(())}, tmp_path / "rec")
  report = testing.check({"x": x.copy(), "scalar": x[:1].reshape(()).copy()}, tmp_path / "rec",
                         **tolerance)
  assert report.ok and [l.status for l in report.leaves] == ["identical"] * 2, str(report)
  assert report.worst is None


@pytest.mark.parametrize("recorded, got, what", EQUAL_PAIRS)
def test_nan_payloads_and_zero_signs_are_value_equal_within_any_tolerance(
    tmp_path, recorded, got, what):
  x = specials(np.float32)
  i = list(PATTERNS[np.float32][1]).index(recorded)
  testing.record({"x": x}, tmp_path / "rec")
  actual = with_element(x, i, bits32(got)[0])
  for tolerance in (CROSS, {"rtol": 1e-3}, {"max_ulp": 0}):
    report = testing.check({"x": actual}, tmp_path / "rec", **tolerance)
    [leaf] = report.leaves
    assert report.ok and leaf.status == comparison.VALUE_EQUAL, str(report)
    assert (leaf.differing, leaf.size, leaf.detail) == (1, x.size, what)
    assert f"1 of {x.size} elements value-equal, bits differ ({what})  within tolerance" in str(
        report)
    assert "BEYOND" not in str(report) and report.worst is leaf
    assert report.summary() == "PASS (1 leaves: 0 identical, 1 value-equal (bits differ), " \
                               "0 within tolerance)"


@pytest.mark.parametrize("recorded, got, what", EQUAL_PAIRS)
def test_bit_for_bit_still_flags_value_equal_bits(tmp_path, recorded, got, what):
  """Same jax: bit for bit stays bit for bit, and says it is only the bits."""
  x = specials(np.float32)
  i = list(PATTERNS[np.float32][1]).index(recorded)
  testing.record({"x": x}, tmp_path / "rec")
  report = testing.check({"x": with_element(x, i, bits32(got)[0])}, tmp_path / "rec")
  [leaf] = report.leaves
  assert report.tolerance.exact and not report.ok and leaf.status == comparison.BITS_DIFFER
  assert report.only_bits_differ
  [line] = [l for l in str(report).splitlines() if l.startswith("  ['x']")]
  assert line.endswith(f"1 of {x.size} elements value-equal, bits differ ({what})  NOT BIT FOR BIT")
  assert "BEYOND" not in str(report) and report.summary().startswith("FAIL (1 leaves fail: ['x'];")


def test_value_equal_elements_beside_other_differences_are_counted(tmp_path):
  x = specials(np.float32)
  testing.record({"x": x}, tmp_path / "rec")
  nan, one_and_a_half = 2, 10  # a quiet NaN; 1.5
  actual = with_element(with_element(x, nan, bits32(0x7FC00001)[0]), one_and_a_half,
                        ulps_apart(np.float32(1.5), 1))
  within = testing.check({"x": actual}, tmp_path / "rec", **CROSS)
  [leaf] = within.leaves
  assert within.ok and leaf.status == "within" and leaf.differing == 2 and leaf.max_ulp == 1
  assert leaf.detail == "1 of those value-equal, bits differ: 1 NaN payload"
  exact = testing.check({"x": actual}, tmp_path / "rec")
  assert exact.leaves[0].status == "beyond" and not exact.only_bits_differ


@pytest.mark.parametrize("recorded, got", UNMATCHED)
def test_unmatched_non_finite_values_are_beyond_any_tolerance(tmp_path, recorded, got):
  x = np.array([1.5, recorded, -3.0], np.float32)
  testing.record({"x": x}, tmp_path / "rec")
  actual = with_element(x, 1, got)
  for tolerance in ({}, CROSS, {"max_ulp": 2 ** 40}, {"rtol": 1e9, "atol": 1e38}):
    report = testing.check({"x": actual}, tmp_path / "rec", **tolerance)
    [leaf] = report.leaves
    assert not report.ok and leaf.status == "beyond", (tolerance, str(report))
    assert leaf.max_abs == np.inf and "BEYOND TOLERANCE" in str(report)
    nan_once = np.isnan(recorded) != np.isnan(got)
    assert ("1 element is NaN in one run only" if nan_once else "1 element differs in an "
            f"infinity, the first at (1,): recorded {np.float32(recorded)}, got "
            f"{np.float32(got)}") == leaf.detail


def test_an_infinity_one_ulp_from_the_largest_float_is_still_beyond():
  """Counted in representable values, inf is next to the largest float32; no bound covers it."""
  inf, biggest = np.array([np.inf], np.float32), np.array([BIGGEST], np.float32)
  with np.errstate(over="ignore"):
    assert np.nextafter(biggest, inf)[0] == inf[0]
  assert comparison.ulp_distance(inf, biggest)[0] == 1
  stats = comparison.compare_values(inf, biggest, Tolerance(False, 16))
  assert stats["status"] == "beyond" and stats["max_ulp"] == 0
  # float64 values that are all float32 values are measured in float32 ulp: still beyond.
  stats = comparison.compare_values(inf.astype(np.float64), biggest.astype(np.float64),
                                    Tolerance(False, 16))
  assert stats["status"] == "beyond"


BOUND = testing.CROSS_VERSION_MAX_ULP


@pytest.mark.parametrize("off, caught", [(1, False), (BOUND, False), (BOUND + 1, True),
                                         (4096, True)])
def test_a_wrong_value_next_to_an_infinity_is_caught_at_leaf_scale(tmp_path, off, caught):
  """The leaf scale is its largest finite magnitude (3.0), not the infinities beside it."""
  x = np.array([np.inf, -np.inf, np.nan, 1.5, 3.0], np.float32)
  testing.record({"x": x}, tmp_path / "rec")
  moved = ulps_apart(np.float32(3.0), off)
  report = testing.check({"x": with_element(x, 4, moved)}, tmp_path / "rec", **CROSS)
  [leaf] = report.leaves
  assert report.ok is not caught and leaf.status == ("beyond" if caught else "within")
  assert leaf.max_ulp == off and leaf.differing == 1
  assert leaf.scale_ulp == (float(moved) - 3.0) / float(np.spacing(np.float32(3.0))) == off
  assert leaf.max_abs == float(moved) - 3.0  # the infinities, identical, add nothing


def test_subnormal_differences_are_measured_at_the_smallest_subnormal(tmp_path):
  tiny = np.finfo(np.float32).smallest_subnormal
  x = bits32(0x00000000, 0x80000000, 0x00000001, 0x00000003, 0x807FFFFF)
  testing.record({"x": x}, tmp_path / "rec")
  assert testing.check({"x": x.copy()}, tmp_path / "rec").leaves[0].status == "identical"
  actual = with_element(x, 3, np.nextafter(x[3], np.float32(1)))
  report = testing.check({"x": actual}, tmp_path / "rec", max_ulp=1)
  [leaf] = report.leaves
  assert report.ok and leaf.status == "within" and leaf.max_ulp == 1
  # The largest magnitude is subnormal: one ulp there is the smallest subnormal.
  assert leaf.scale_ulp == float(actual[3] - x[3]) / float(tiny) == 1.0
  far = with_element(x, 3, np.float32(1e-30))
  assert not testing.check({"x": far}, tmp_path / "rec", **CROSS).ok


def test_legacy_comparison_helper_is_bit_for_bit_and_names_equal_values():
  """tests/support/compare.py: bit for bit unless rtol/atol is given; value-equal bits named."""
  x = specials(np.float32)
  assert_leaf_equal(x, x.copy())
  for recorded, got, _ in EQUAL_PAIRS:
    actual = with_element(x, list(PATTERNS[np.float32][1]).index(recorded), bits32(got)[0])
    with pytest.raises(AssertionError, match=r"value-equal, bits differ .* legacy bits "
                       f"0x{recorded:08x} vs 0x{got:08x}"):
      assert_leaf_equal(x, actual)
    assert_leaf_equal(x, actual, rtol=1e-6)
  for recorded, got in UNMATCHED:
    expected = np.array([1.5, recorded], np.float32)
    for tolerance in ({}, {"rtol": 1e-3, "atol": 1e-3}):
      with pytest.raises(AssertionError, match="differ from legacy"):
        assert_leaf_equal(expected, with_element(expected, 1, got), **tolerance)


# --------------------------------------------------------------------------- part scale


# One scan iteration's results: an energy that may be infinite, two values, specials.
LOOP = Loop(0, "scan", (), (0, 1), {"entry": (), "input": (),
                                    "result": (((), "float32"), ((2,), "float32"),
                                               ((10,), "float32"))}, "p.py:1")
ITERATIONS = 4
PER_CALL = Tolerance(False, PER_CALL_MAX_ULP)  # the default per-call bound across releases


def results(energy=np.inf, values=(0.5, 60.0), special=None) -> list[np.ndarray]:
  return [np.array(energy, np.float32), np.array(values, np.float32),
          specials(np.float32)[:10] if special is None else special]


def replay(changes: dict[int, list[np.ndarray]], recorded_results=None,
           tolerance: Tolerance = PER_CALL) -> loop_records.LoopCheck:
  """Replays ITERATIONS iterations recorded with `recorded_results`, this run giving
  `changes[i]` at iteration i (else the recorded values, copied), and checks them."""
  recorded_results = recorded_results or results()
  recorded = loop_records.RecordedIterations(
      {0: LOOP}, {(0, "result", 0, (i,)): recorded_results for i in range(ITERATIONS)})
  replayer = loop_records.IterationReplayer(recorded)
  for i in range(ITERATIONS):
    mine = changes.get(i, [v.copy() for v in recorded_results])
    assert replayer.step(LOOP, "result", 0, (i,), mine) is recorded.values[(0, "result", 0, (i,))]
  return loop_records.check(recorded, replayer, tolerance)


@pytest.mark.parametrize("tolerance", [PER_CALL, Tolerance(True)],
                         ids=["max-ulp", "bit-for-bit"])
@pytest.mark.parametrize("energy", [np.inf, -np.inf, np.nan])
def test_identical_non_finite_values_are_identical_at_part_scale(energy, tolerance):
  """The issue's case: result 0 is infinite, in the recording and in this run alike."""
  check = replay({}, results(energy), tolerance)
  assert check.ok and (check.iterations, check.identical) == (ITERATIONS, ITERATIONS)
  assert check.worst is None and not check.beyond
  assert check.summary() == (f"{ITERATIONS} loop iterations replayed: {ITERATIONS} identical, "
                             "0 within tolerance")


def test_nan_payloads_and_zero_signs_are_value_equal_at_part_scale():
  recorded = results()
  payload = with_element(recorded[2], 3, bits32(0x7FFFFFFF)[0])  # 0x7fc00001 was recorded
  sign = with_element(recorded[2], 6, bits32(0x80000000)[0])  # +0.0 was recorded
  changes = {1: [recorded[0].copy(), recorded[1].copy(), payload],
             2: [recorded[0].copy(), recorded[1].copy(), sign]}
  within = replay(changes)
  assert within.ok and (within.iterations, within.identical) == (ITERATIONS, ITERATIONS - 2)
  assert within.worst is not None and within.worst.status == comparison.VALUE_EQUAL
  assert within.summary() == (f"{ITERATIONS} loop iterations replayed: {ITERATIONS - 2} "
                              "identical, 2 within tolerance")
  exact = replay(changes, tolerance=Tolerance(True))
  assert not exact.ok and exact.only_bits_differ
  assert [(d.path, d.status) for d in exact.beyond] == [((1,), comparison.BITS_DIFFER),
                                                         ((2,), comparison.BITS_DIFFER)]
  assert [d.describe() for d in exact.beyond] == [
      "loop 0 (scan at p.py:1) iteration (1) on device 0, result 2 float32[10]: value-equal, "
      "bits differ (1 NaN payload)",
      "loop 0 (scan at p.py:1) iteration (2) on device 0, result 2 float32[10]: value-equal, "
      "bits differ (1 sign of zero)"]
  assert exact.summary() == (f"{ITERATIONS} loop iterations replayed: {ITERATIONS - 2} "
                             "identical, 0 within tolerance, 2 NOT BIT FOR BIT (value-equal, "
                             "bits differ)")


@pytest.mark.parametrize("off, caught", [(1, False), (PER_CALL_MAX_ULP, False),
                                         (PER_CALL_MAX_ULP + 1, True), (4096, True)])
def test_a_wrong_value_next_to_an_infinity_is_caught_at_part_scale(off, caught):
  """The part's scale is its largest finite magnitude (60), not its infinite energy: 0.5
  moved by `off` ulp of 60 is that many ulp at part scale."""
  step = float(np.spacing(np.float32(60.0)))
  recorded = results()
  moved = [recorded[0].copy(), np.array([0.5 + off * step, 60.0], np.float32),
           recorded[2].copy()]
  check = replay({2: moved}, recorded)
  assert check.ok is not caught and check.worst is not None
  worst = check.worst
  assert (worst.path, worst.index, worst.status) == ((2,), 1, "beyond" if caught else "within")
  assert worst.part_ulp == off and worst.max_abs == off * step
  # In its own ulp, 64 times as many: 0.5's spacing is 2 ** 6 times finer than 60's.
  assert worst.max_ulp == off * step / float(np.spacing(np.float32(0.5)))
  if caught:
    assert check.beyond == [worst] and check.summary().endswith(", 1 BEYOND TOLERANCE")


@pytest.mark.parametrize("recorded_energy, got_energy", UNMATCHED)
def test_unmatched_non_finite_values_are_beyond_at_part_scale(recorded_energy, got_energy):
  recorded = results(recorded_energy)
  check = replay({0: [np.array(got_energy, np.float32), recorded[1].copy(),
                      recorded[2].copy()]}, recorded)
  assert not check.ok and [(d.path, d.index, d.status) for d in check.beyond] == [
      ((0,), 0, "beyond")]
  [beyond] = check.beyond
  assert beyond.max_abs == np.inf and beyond.describe().endswith(f"({beyond.detail})")
  assert "NaN in one run only" in beyond.detail or "in an infinity" in beyond.detail


# --------------------------------------------------------------------------- per call


# A chain whose scan returns, every iteration, NaNs with a payload, a zero of a sign and an
# infinite energy beside its finite state; `payload`, `zero` and `rate` say which.
CHAIN = textwrap.dedent('''
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax


    def run(payload="7fc00001", zero=-0.0, rate=0.5):
      def chain(x):
        def step(carry, _):
          y, t = carry
          nans = lax.bitcast_convert_type(jnp.full(y.shape, int(payload, 16), jnp.uint32),
                                          jnp.float32)
          zeros = jnp.full(y.shape, zero, jnp.float32)
          return (y * rate + 1.0, t + 1.0), (nans, zeros, jnp.float32(jnp.inf) + t)
        return lax.scan(step, (x, jnp.float32(0.0)), None, length=3)
      return jax.pmap(chain)(np.linspace(-1.0, 1.0, 16, dtype=np.float32).reshape(8, 2))
''')


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> tuple[str, str]:
  """The program, and its recording (this jax, legacy jax.pmap) with the default kwargs."""
  directory = tmp_path_factory.mktemp("chain")
  program = str(directory / "chain.py")
  with open(program, "w", encoding="utf-8") as f:
    f.write(CHAIN)
  out = str(directory / "rec")
  assert main(["record", program, "--out", out]) == 0
  return program, out


def _check(chain, capsys, *args: str) -> tuple[int, list[str]]:
  program, out = chain
  code = main(["check", program, "--against", out, "--per-call", *args])
  return code, capsys.readouterr().out.splitlines()


def test_the_recording_holds_the_bits_the_chain_computed(chain):
  _, out = chain
  stored = calls.read(out)
  [site] = stored.sites.values()
  stepped = stored.stepped(site, 0)
  assert stepped is not None
  iterations = stepped[0]
  for device in range(8):
    for i in range(3):
      _, _, nans, zeros, energy = iterations.values[(0, "result", device, (i,))]
      assert (nans.view(np.uint32) == 0x7FC00001).all(), nans.view(np.uint32)
      assert (zeros.view(np.uint32) == 0x80000000).all() and energy == np.inf


@pytest.mark.parametrize("tolerance", [[], ["--max-ulp", str(PER_CALL_MAX_ULP)]],
                         ids=["bit-for-bit", "max-ulp"])
def test_a_chain_of_identical_non_finite_values_checks_identical(chain, capsys, tolerance):
  code, lines = _check(chain, capsys, *tolerance)
  assert code == 0, "\n".join(lines)
  assert "    call 0: identical" in lines
  assert ("      24 loop iterations replayed: 24 identical, 0 within tolerance; the outputs "
          "compared are the call's with every iteration replayed") in lines


@pytest.mark.parametrize("kwargs, what", [({"payload": "ffc00000"}, "2 NaN payloads"),
                                          ({"zero": 0.0}, "2 signs of zero")])
def test_a_chain_with_other_nan_payloads_or_zero_signs(chain, capsys, kwargs, what):
  """Value-equal: passes a tolerance that compares values; fails bit for bit, named."""
  as_json = json.dumps(kwargs)
  code, lines = _check(chain, capsys, "--kwargs", as_json, "--max-ulp", str(PER_CALL_MAX_ULP))
  text = "\n".join(lines)
  assert code == 0 and "BEYOND" not in text and lines[-1].startswith("PASS"), text
  assert ("      24 loop iterations replayed: 0 identical, 24 within tolerance; the outputs "
          "compared are the call's with every iteration replayed") in lines
  assert any(l.startswith("      worst iteration: ") and l.endswith(
      f"value-equal, bits differ ({what})") for l in lines), text
  code, lines = _check(chain, capsys, "--kwargs", as_json)
  text = "\n".join(lines)
  assert code == 1 and "BEYOND TOLERANCE" not in text, text
  [call] = [l for l in lines if l.startswith("    call 0:")]
  assert call.startswith("    call 0: NOT BIT FOR BIT: in its loops: loop 0 (scan at "
                         "chain.py:") and call.endswith(f"value-equal, bits differ ({what})")
  assert ("      24 loop iterations replayed: 0 identical, 0 within tolerance, 24 NOT BIT FOR "
          "BIT (value-equal, bits differ)") in text


def test_a_wrong_step_beside_the_infinite_energy_is_still_caught(chain, capsys):
  code, lines = _check(chain, capsys, "--kwargs", '{"rate": 0.501}', "--max-ulp",
                       str(PER_CALL_MAX_ULP))
  text = "\n".join(lines)
  assert code == 1, text
  [call] = [l for l in lines if l.startswith("    call 0:")]
  assert call.startswith("    call 0: BEYOND TOLERANCE: in its loops: loop 0 (scan at chain.py:")
  assert " iteration (0) on device 0, result 0 float32[2]: " in call, call
