"""The kit's command line: ``python -m sgd_shm COMMAND [options]`` (installed as
``sgd-shm COMMAND [options]``); ``python -m sgd_shm COMMAND --help`` lists a
command's options.

commands:
  ps        the main job (the default: ``python -m sgd_shm [options]`` runs it): the
            multi-process parameter server on an embedded default, BSP, ASP, SSP and
            straggler-aware SaPS with worker 0 slowed 4x (see :mod:`sgd_shm.ps.__main__`)
  hogwild   lock-free Hogwild SGD on an embedded RCV1-like problem, with 1 and 2 workers
            (threads and processes), beside scikit-learn's SGDClassifier
            (see :mod:`sgd_shm.hogwild.__main__`)
  eager     synchronous, solo and majority allreduce (eager-SGD) under load imbalance
            (see :mod:`sgd_shm.eager.__main__`)
  sim       policies and collectives at 16-1,024 simulated workers, in virtual time
            (see :mod:`sgd_shm.sim.__main__`)
  selftest  every component briefly: a smoke test of an installed kit
            (see :mod:`sgd_shm.selftest`)

Every command takes ``-v`` (progress and diagnostics logged at INFO on stderr) and
``-vv`` (DEBUG); results are printed on stdout.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

#: command -> (module with add_arguments(ap), check(ap, args) and run(args), summary)
COMMANDS = {
    "ps": ("sgd_shm.ps.__main__",
           "the parameter server main job: BSP, ASP, SSP, SaPS with a straggler (default)"),
    "hogwild": ("sgd_shm.hogwild.__main__",
                "lock-free Hogwild SGD beside scikit-learn's SGDClassifier"),
    "eager": ("sgd_shm.eager.__main__",
              "sync, solo and majority allreduce (eager-SGD) under load imbalance"),
    "sim": ("sgd_shm.sim.__main__",
            "policies and collectives at 16-1,024 simulated workers, in virtual time"),
    "selftest": ("sgd_shm.selftest", "a smoke test of every component of the installed kit"),
}
#: what ``python -m sgd_shm [options]`` runs (the README's quick start)
DEFAULT = "ps"

_RAW = argparse.RawDescriptionHelpFormatter
_DESCRIPTION = """The kit's command line. `python -m sgd_shm COMMAND --help` lists a command's
options; every command takes -v (progress and diagnostics logged at INFO on stderr)
and -vv (DEBUG). Options with no command run `ps`, the main job."""
_EXAMPLES = """examples:
  python -m sgd_shm                                  # the main job: ps on its defaults
  python -m sgd_shm ps --workers 2 --policies bsp,saps --seconds 3 --out results/
  python -m sgd_shm hogwild --samples 20000 --features 5000
  python -m sgd_shm eager --reps 3
  python -m sgd_shm sim --workers 128 --policies bsp,asp,saps --gbps 10
  python -m sgd_shm selftest --only hogwild,compress
  (installed: sgd-shm COMMAND [options])"""


def _verbosity() -> argparse.ArgumentParser:
    """The -v/--verbose option every command takes (a parent parser)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="log progress and diagnostics on stderr: -v at INFO, -vv at DEBUG "
                        "(default: warnings only)")
    return p


def configure_logging(verbose: int) -> None:
    """Basic logging for a command run from the command line (never at import: the
    library itself only logs): WARNING, INFO with -v, DEBUG with -vv."""
    level = logging.WARNING if not verbose else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)


def _module(name):
    return importlib.import_module(COMMANDS[name][0])


def build_parser(prog: str = "python -m sgd_shm"):
    """(the top-level parser, {command: its subparser})."""
    import relaxed
    ap = argparse.ArgumentParser(prog=prog, description=_DESCRIPTION, epilog=_EXAMPLES,
                                 formatter_class=_RAW)
    ap.add_argument("--version", action="version",
                    version=f"relaxed-sgd-kit {relaxed.__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    subs = {}
    for name, (_, summary) in COMMANDS.items():
        mod = _module(name)
        sp = sub.add_parser(name, help=summary, description=mod.__doc__, formatter_class=_RAW,
                            parents=[_verbosity()])
        mod.add_arguments(sp)
        subs[name] = sp
    return ap, subs


def _run(name, ap, args) -> int:
    configure_logging(args.verbose)
    mod = _module(name)
    args = mod.check(ap, args)
    from sgd_shm.core.errors import DivergenceError
    try:
        return mod.run(args)
    except DivergenceError:
        raise                          # a run's outcome, not a usage error: its traceback
    except (ValueError, TypeError) as e:
        # the library's refusal of a combination of options the checks above let
        # through (e.g. --imbalance K above --workers): its message, not a traceback
        if args.verbose:
            raise
        ap.error(f"{e} (-v shows the traceback)")


def main(argv=None) -> int:
    """``python -m sgd_shm`` / ``sgd-shm``: parse ``argv`` (default sys.argv[1:]) and run
    the command; options with no command run the default one (``ps``). Returns the exit
    status; argparse exits with 2 on a bad option and 0 after --help."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = [DEFAULT, *argv]
    ap, subs = build_parser()
    args = ap.parse_args(argv)
    return _run(args.command, subs[args.command], args)


def standalone(name: str, argv=None, prog: str | None = None) -> int:
    """One command as a program of its own (``python -m sgd_shm.ps``,
    ``python -m sgd_shm.eager``, ``python -m sgd_shm.hogwild``): the same options,
    rules and run as ``python -m sgd_shm NAME``."""
    mod = _module(name)
    ap = argparse.ArgumentParser(prog=prog or f"python -m sgd_shm {name}",
                                 description=mod.__doc__, formatter_class=_RAW,
                                 parents=[_verbosity()])
    mod.add_arguments(ap)
    args = ap.parse_args(sys.argv[1:] if argv is None else list(argv))
    return _run(name, ap, args)


if __name__ == "__main__":
    raise SystemExit(main())
