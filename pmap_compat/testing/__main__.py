"""`python -m pmap_compat.testing record|check ...` (see the package docstring)."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from collections.abc import Sequence

from pmap_compat.testing import calls, programs, supervision

# Exit statuses.
PASS, DIFFERS, NOT_COMPARED = 0, 1, 2


def _seconds(text: str) -> int:
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f"a whole number of seconds, at least 1, not {text}")
  return value


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="python -m pmap_compat.testing",
      description="Record a program's outputs, or check a new run against a recording.")
  sub = parser.add_subparsers(dest="command", required=True)

  def common(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", metavar="PROGRAM",
                   help="a .py file or module name defining run(**kwargs) -> pytree")
    p.add_argument("--function", default="run", metavar="NAME",
                   help="the function to call instead of run")
    p.add_argument("--kwargs", default="{}", metavar="JSON",
                   help="keyword arguments for the function, as a JSON object")
    p.add_argument("--patched", action="store_true",
                   help="import and run the program under pmap_compat.patched()")
    p.add_argument("--collective-timeout", type=_seconds, default=supervision.DEFAULT_TIMEOUT_S,
                   metavar="S", help="on the CPU backend, how long a collective may wait "
                   "for its slowest device, after XLA's warning that it may be stuck, before "
                   "XLA ends the process (XLA's own 40 s are short on a loaded machine), "
                   "where this jaxlib lets it be set; a run that uses no CPU for twice as "
                   "long is ended as stuck (default "
                   f"{supervision.DEFAULT_TIMEOUT_S})")

  rec = sub.add_parser("record", help="run PROGRAM and store its outputs in DIR")
  common(rec)
  rec.add_argument("--out", required=True, metavar="DIR", help="where to write the recording")
  rec.add_argument("--calls", type=int, default=calls.DEFAULT_CALLS, metavar="K",
                   help="also store the inputs and outputs of each pmap site's first K calls, "
                   f"for check --per-call (default {calls.DEFAULT_CALLS}; 0: final outputs only)")
  rec.add_argument("--max-call-bytes", type=int, default=calls.DEFAULT_MAX_BYTES, metavar="N",
                   help="stop with an error when the stored calls would pass N bytes "
                   f"(default {calls.DEFAULT_MAX_BYTES:,}); replicated leaves count once")
  rec.add_argument("--no-loop-steps", dest="loop_steps", action="store_false",
                   help="store each call's inputs and outputs only, not every iteration of "
                   "the loops inside it (which check --per-call replays one by one)")
  chk = sub.add_parser("check", help="run PROGRAM and compare its outputs with a recording")
  common(chk)
  chk.add_argument("--against", required=True, metavar="DIR", help="the recording")
  chk.add_argument("--rtol", type=float, default=None, metavar="R")
  chk.add_argument("--atol", type=float, default=None, metavar="A")
  chk.add_argument("--max-ulp", type=int, default=None, metavar="N")
  chk.add_argument("--per-call", action="store_true",
                   help="check each recorded pmap call on its recorded inputs and replay its "
                   "recorded outputs, so differences cannot compound from call to call")
  chk.add_argument("--calibrate", action="store_true",
                   help="with --per-call: first run the recorded program, unpatched and "
                   "unconverted, under this release's own jax.pmap, and take the per-call "
                   "bound from how far that run is from the recording (twice JAX's own "
                   "drift, at least the default); it is printed, then used for this check")
  chk.add_argument("--calibrate-with", metavar="ORIGINAL", default=None,
                   help="the pmap program to calibrate with (default: PROGRAM, else the "
                   "recorded file, whichever still has the recorded source)")
  return parser


def _patched(enabled: bool) -> contextlib.AbstractContextManager:
  if not enabled:
    return contextlib.nullcontext()
  try:
    import pmap_compat  # pylint: disable=import-outside-toplevel
    return pmap_compat.patched()
  except Exception as e:  # pylint: disable=broad-except
    import jax  # pylint: disable=import-outside-toplevel
    raise RuntimeError(f"--patched: pmap_compat does not run on jax {jax.__version__} "
                       f"({type(e).__name__}: {e})") from e


def _emit(text: str) -> None:
  """One write per process, so the reports of a multi-process job do not interleave."""
  import jax  # pylint: disable=import-outside-toplevel
  if jax.process_count() > 1:
    prefix = f"[process {jax.process_index()}/{jax.process_count()}] "
    text = "\n".join(prefix + line for line in text.splitlines())
  sys.stdout.write(text + "\n")
  sys.stdout.flush()


def _record(args: argparse.Namespace, kwargs: dict) -> int:
  import pmap_compat.testing as testing  # pylint: disable=import-outside-toplevel
  from pmap_compat.testing import per_call  # pylint: disable=import-outside-toplevel
  observe = (per_call.recording_calls(args.out, calls_per_site=args.calls,
                                      max_bytes=args.max_call_bytes,
                                      step_loops=args.loop_steps) if args.calls
             else contextlib.nullcontext())
  with _patched(args.patched), observe as recorder:
    fn = programs.find_function(programs.load_program(args.program), args.function)
    recording = testing.record(fn, args.out, kwargs=kwargs)
  text = (f"recorded {len(recording.leaves)} leaves of {args.program}:{args.function} into "
          f"{recording.directory} (jax {recording.producer['jax']}, "
          f"{recording.producer['produced_by']})")
  if recorder is not None:
    writer = recorder.writer
    text += (f"\nrecorded the first {writer.calls_per_site} calls of {len(writer.sites)} pmap "
             f"sites ({sum(e.recorded for e in writer.sites.values())} calls, "
             f"{writer.bytes:,} bytes of arrays) for check --per-call")
    if writer.iterations:
      text += (f"; {writer.stepped_calls} of those calls hold loops: {writer.iterations:,} "
               "loop iterations stored")
  _emit(text)
  return PASS


def _check(args: argparse.Namespace, kwargs: dict) -> int:
  import pmap_compat.testing as testing  # pylint: disable=import-outside-toplevel
  from pmap_compat.testing import per_call  # pylint: disable=import-outside-toplevel
  tolerance = {"rtol": args.rtol, "atol": args.atol, "max_ulp": args.max_ulp}
  calibrated = None
  if args.calibrate or args.calibrate_with is not None:
    if not (args.calibrate and args.per_call):
      raise ValueError("--calibrate sets the per-call bound: use it with --per-call"
                       + ("" if args.calibrate else " (and --calibrate-with with --calibrate)"))
    given = [f"--{name.replace('_', '-')}" for name, value in tolerance.items()
             if value is not None]
    if given:
      raise ValueError(f"--calibrate sets the bound that {' / '.join(given)} would: give "
                       "one or the other")
    from pmap_compat.testing import calibrate  # pylint: disable=import-outside-toplevel
    result = calibrate.calibrate(args.program, args.against, function=args.function,
                                 kwargs=kwargs, calibrate_with=args.calibrate_with)
    calibrated = result.tolerance
    _emit(result.text)  # before the check's own run, which may take long
  observe = (per_call.checking_calls(args.against, tolerance=calibrated, **tolerance)
             if args.per_call else contextlib.nullcontext())
  with _patched(args.patched), observe as replayer:
    fn = programs.find_function(programs.load_program(args.program), args.function)
    report = testing.check(fn, args.against, kwargs=kwargs, **tolerance)
  if replayer is None:
    _emit(f"{args.program}:{args.function}\n{report}")
    return PASS if report.ok else DIFFERS
  calls_report = replayer.report(report)
  _emit(f"{args.program}:{args.function}\n{calls_report}")
  return PASS if calls_report.ok else DIFFERS


def _run(args: argparse.Namespace) -> int:
  kwargs = programs.parse_kwargs(args.kwargs)
  return (_record if args.command == "record" else _check)(args, kwargs)


def main(argv: Sequence[str] | None = None, *, supervised: bool = False,
         fork: bool | None = None) -> int:
  """Runs the command line. `supervised` (the `python -m` entry point): in a child process
  that XLA may end, with the CPU collectives' time limit raised first (supervision);
  `fork`: whether that child is a fork or a new interpreter (default: as the platform
  allows)."""
  args = _parser().parse_args(argv)
  if supervised and supervision.RESPAWNED not in os.environ:
    timeout = supervision.CollectiveTimeout.for_this_jax(args.collective_timeout)
    respawn = [sys.executable, *(f"-W{option}" for option in sys.warnoptions), "-m",
               "pmap_compat.testing", *(sys.argv[1:] if argv is None else argv)]
    return supervision.supervise(lambda: _main(args), timeout, args.command, respawn,
                                 fork)
  return _main(args)


def _main(args: argparse.Namespace) -> int:
  status = NOT_COMPARED
  try:
    status = _run(args)
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    print(f"error: {type(e).__name__}: {e}\nnothing was {args.command}ed", file=sys.stderr)
  finally:
    programs.shutdown_distributed()
  return status


if __name__ == "__main__":
  sys.exit(main(supervised=True))
