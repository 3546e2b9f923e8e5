"""The real third-party programs, the environments they run in, and the modes they run in.

Plain data, no JAX: read by the runner (run_mode.py, inside a real-programs environment)
and by the tests (in the main suite's environment).
"""
from __future__ import annotations

import dataclasses
import os

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROGRAMS_DIR = os.path.join(HERE, "programs")


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
  name: str  # module name under programs/
  packages: tuple[str, ...]  # the libraries' top-level packages the codemod mode converts
  # The pmapped step functions: each name with the names JAX's compile log may give it (less
  # `jit(...)` / `pmap_`; legacy pmap logs a functools.partial as "<unnamed wrapped function>").
  # Legacy pmap compiles each `compiles` times; every mode must too.
  steps: dict[str, tuple[str, ...]]
  # The pip distributions the program imports (a line without a release of one skips it).
  distributions: tuple[str, ...]
  # The module under programs/ when it is not `name`: the same program with other options.
  module: str = ""
  # How often legacy pmap's run compiles each step (its own case checks it): once, unless
  # a jitted step gets the host's values first and then its own outputs.
  compiles: int = 1
  # Whether the steps are the pmapped functions (jax 0.10.2's own pmap logs each as `_fun`),
  # not jitted functions that call a pmap.
  pmapped_steps: bool = True

  @property
  def path(self) -> str:
    return os.path.join(PROGRAMS_DIR, f"{self.module or self.name}.py")


# Legacy pmap's compile-log name for a pmapped functools.partial (a jit of a partial logs as
# "jit(<unnamed wrapped function>)": that is not a step).
PARTIAL = "<unnamed wrapped function>"

PROGRAMS = {
    p.name: p for p in (
        Program("numpyro_nuts", packages=("numpyro",), distributions=("numpyro",),
                steps={"_single_chain_mcmc": ("_single_chain_mcmc", PARTIAL)}),
        Program("brax_ppo", packages=("brax",), distributions=("brax", "flax", "optax"),
                steps={"training_epoch": ("training_epoch",)}),
        # brax's own max_devices_per_host: the inputs it places on 2 of the 8 devices.
        Program("brax_ppo_two_devices", packages=("brax",), module="brax_ppo",
                distributions=("brax", "flax", "optax"),
                steps={"training_epoch": ("training_epoch",)}),
        # The rows of the keys ARS splits per call: its pmap runs on 2 of the 8 devices,
        # inside its jitted training_epoch.
        Program("brax_ars_two_devices", packages=("brax",), module="brax_ars",
                distributions=("brax", "flax", "optax"),
                steps={"training_epoch": ("training_epoch",)}, compiles=2,
                pmapped_steps=False),
        Program("flax_imagenet", packages=("flax",), distributions=("flax", "optax"),
                steps={"train_step": ("train_step", PARTIAL), "eval_step": ("eval_step",)}),
        Program("flax_nnx_pmap", packages=("flax",), distributions=("flax",),
                steps={"train_step": ("train_step", PARTIAL), "evaluate": ("evaluate", PARTIAL)}),
    )
}

# Plain jax.pmap: legacy's on jax 0.6.0, the release's own (shard_map-based) on 0.10.
PLAIN = ("legacy", "jax_pmap")
# `with pmap_compat.patched():` around the library's import and the run / around the run only;
# the library's source converted by the codemod and put first on sys.path.
CONVERTED = ("patched_before", "patched_after", "codemod")
MODES = PLAIN + CONVERTED

# The JAX line of each real-programs environment and the mode that is its reference.
LEGACY_LINE = "0.6.0"
NEWEST_LINE = "0.10.2"
REFERENCE = {LEGACY_LINE: "legacy", NEWEST_LINE: "jax_pmap"}
# Where the line's own pmap cannot run the library, the other modes are compared with the
# first of them, and why.
PLAIN_FAILS = {
    (NEWEST_LINE, "brax_ppo"): (
        "patched_before", "brax 0.14.2 (newest) ppo.train calls jax.device_put_replicated, "
        "which jax 0.10.0 removed: AttributeError with JAX's own pmap"),
}
PLAIN_FAILS[NEWEST_LINE, "brax_ppo_two_devices"] = PLAIN_FAILS[NEWEST_LINE, "brax_ppo"]


def reference_mode(line: str, program: str) -> str:
  return PLAIN_FAILS.get((line, program), (REFERENCE[line], ""))[0]


def venv_dir(line: str) -> str:
  return os.path.join(ROOT, f".venv-real-jax{line}")


def python_for(line: str) -> str:
  """The real-programs environment's python for JAX `line`; raises if make has not built it."""
  venv = venv_dir(line)
  if not os.path.exists(os.path.join(venv, ".installed")):
    raise RuntimeError(
        f"no real-programs environment for jax {line} at {venv}: run "
        f"`make {os.path.relpath(venv, ROOT)}/.installed` (`make test` / `make test-all` build it)")
  return os.path.join(venv, "bin", "python")


def constraints_file(line: str) -> str:
  """Every package of that environment pinned exactly; `# skip NAME: reason` lines name the
  libraries with no release for that JAX line (the Makefile prints them when it builds)."""
  return os.path.join(ROOT, ".ci", f"real-programs-jax{line}.txt")


def skipped_libraries(line: str) -> dict[str, str]:
  """The libraries the environment for JAX `line` goes without, with the reason."""
  skipped = {}
  with open(constraints_file(line), encoding="utf-8") as f:
    for text in f:
      if text.startswith("# skip "):
        name, _, reason = text[len("# skip "):].strip().partition(":")
        skipped[name.strip()] = reason.strip()
  return skipped
