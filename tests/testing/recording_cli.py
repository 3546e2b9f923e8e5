"""Helpers for the pmap_compat.testing suite: running its CLI, copying and editing examples."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from support import venvs
from support.multiprocess_jobs import reserved_port

EXAMPLES = os.path.join(venvs.ROOT, "examples")


def cli_env(env: dict | None = None) -> dict:
  """The environment of a CLI run on this suite's jax: 8 CPU devices, this checkout first."""
  full_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
  full_env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8",
                  PYTHONPATH=venvs.ROOT)
  full_env.update(env or {})
  return full_env


def cli_command(args: list[str]) -> list[str]:
  return [sys.executable, "-W", "error::DeprecationWarning", "-m", "pmap_compat.testing", *args]


def cli(args: list[str], version: str | None = None, env: dict | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess:
  """`python -m pmap_compat.testing ARGS` on jax `version` (None: this suite's jax 0.6.0)."""
  if version is not None:
    return venvs.run_python(version, ["-m", "pmap_compat.testing", *args], env=env,
                            timeout=timeout)
  return subprocess.run(cli_command(args), env=cli_env(env), cwd=venvs.ROOT, capture_output=True,
                        text=True, timeout=timeout, check=False)


def copy_example(name: str, directory) -> str:
  """A copy of examples/NAME.py in `directory` (to edit, or to convert in place)."""
  os.makedirs(directory, exist_ok=True)
  return shutil.copy(os.path.join(EXAMPLES, name + ".py"), os.path.join(directory, name + ".py"))


def edit_one_line(path: str, old: str, new: str) -> None:
  """Replaces the one occurrence of `old` in the file (a one-line perturbation)."""
  text = open(path, encoding="utf-8").read()
  assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in {path}"
  with open(path, "w", encoding="utf-8") as f:
    f.write(text.replace(old, new))


def recorded_program(directory, name: str, source: str, iterations: int) -> tuple[str, str]:
  """``source`` written to ``directory/name.py`` and recorded under legacy jax.pmap on jax
  0.6.0, with one call holding ``iterations`` loop iterations: (program, recording)."""
  program = os.path.join(str(directory), f"{name}.py")
  with open(program, "w", encoding="utf-8") as f:
    f.write(source)
  out = os.path.join(str(directory), "rec")
  r = cli(["record", program, "--out", out])
  assert r.returncode == 0 and "(jax 0.6.0, legacy jax.pmap)" in r.stdout, output(r)
  assert f"1 of those calls hold loops: {iterations} loop iterations stored" in r.stdout, r.stdout
  return program, out


def output(proc: subprocess.CompletedProcess) -> str:
  return proc.stdout + proc.stderr


def two_process_job(args: list[str], timeout: float = 240) -> list[subprocess.CompletedProcess]:
  """Starts the CLI twice as one jax.distributed job (4 CPU devices each), as on two hosts."""
  # The port stays reserved for the whole job: no other job can take it meanwhile.
  with reserved_port() as port:
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4",
           "PMAP_EXAMPLE_COORDINATOR": f"127.0.0.1:{port}", "PMAP_EXAMPLE_NUM_PROCESSES": "2"}
    procs = [subprocess.Popen(cli_command(args), cwd=venvs.ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=cli_env({**env, "PMAP_EXAMPLE_PROCESS_ID": str(i)}))
             for i in range(2)]
    results = []
    try:
      for p in procs:
        out, err = p.communicate(timeout=timeout)
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
      for p in procs:
        if p.poll() is None:
          p.kill()
    return results
