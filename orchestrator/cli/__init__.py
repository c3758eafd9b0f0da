"""The ``orchestrate`` command line: one module per command, each with ``add_parser`` and ``run``.

Every command keeps one promise on bad input (a malformed file, an unknown name, a value out of
range, a store that cannot be read or written, a server or cluster that does not answer): one
line ``error: SOURCE: problem`` on stderr, exit code 2, nothing half-written. Ctrl-C ends a
command within seconds with one line saying what is kept (exit 130).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version

from orchestrator.cli.output import HelpFormatter, route_results
from orchestrator.core.interrupts import EXIT_INTERRUPTED, Interrupted
from workloads.core.errors import InputError
from workloads.core.logs import LEVEL_ENV, get_logger
from workloads.core.logs import configure as configure_logging

log = get_logger("orchestrate")

EXIT_INPUT_ERROR = 2
COMMANDS = ("bm25", "expand", "prepare", "run", "augment", "perturb", "sweep", "status", "runs", "report", "compare", "ui", "reset")
# file system errors that are the user's situation, not a bug: one line naming the path
_USER_ERRNOS = {errno.EACCES, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EPERM}


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line and exit 2, like every other bad input."""

    def error(self, message: str) -> None:  # noqa: D102  (argparse's hook)
        self.exit(EXIT_INPUT_ERROR, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def _version() -> str:
    try:
        return version("rerank-lab")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _verbosity(parser: argparse.ArgumentParser, suppress: bool) -> None:
    group = parser.add_mutually_exclusive_group()
    default = argparse.SUPPRESS if suppress else False
    group.add_argument("-v", "--verbose", action="store_true", default=default,
                       help="debug messages, and Ray's and Tune's own output on the terminal")
    group.add_argument("-q", "--quiet", action="store_true", default=default, help="warnings and errors only")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="orchestrate", description="rerank-lab: neural re-ranking experiments (README, docs/)",
                           formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"rerank-lab {_version()}")
    _verbosity(parser, suppress=False)  # before the command (orchestrate -v sweep ...) or after it
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    _verbosity(common, suppress=True)
    for name in COMMANDS:
        import_module(f"orchestrator.cli.{name}").add_parser(sub, common)
    return parser


def _stop_ray_output() -> None:
    """End this process's Ray session before the last word, so that no worker's or actor's
    late log line (forwarded by Ray's log monitor) is printed after it."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    try:
        ray.shutdown()
    except (Exception, KeyboardInterrupt):  # noqa: BLE001 - a Ray going down (or a second Ctrl-C) hides no summary
        logging.getLogger("rerank_lab.cli").debug("ray.shutdown failed", exc_info=True)


def main(argv: list[str] | None = None) -> int:
    from orchestrator.core.execution import input_error_in, set_environment_defaults

    set_environment_defaults()
    args = build_parser().parse_args(argv)
    route_results()
    level = "DEBUG" if args.verbose else "WARNING" if args.quiet else "INFO"
    os.environ[LEVEL_ENV] = level  # Ray workers log at the driver's level
    configure_logging(level)
    try:
        return args.func(args)
    except InputError as exc:
        print(f"error: {input_error_in(exc)}", file=sys.stderr)  # (a Ray task's arrives as its RayTaskError)
        return EXIT_INPUT_ERROR
    except Interrupted as exc:
        _stop_ray_output()
        print(f"interrupted: {exc.summary}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        _stop_ray_output()
        print("interrupted: stopped before anything was reported as complete (what finished is kept)", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (`| head`): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())
        return 0
    except OSError as exc:
        if exc.errno not in _USER_ERRNOS:
            raise
        where = exc.filename or "a file"
        print(f"error: {where}: cannot write here ({os.strerror(exc.errno).lower()})", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except Exception as exc:
        error = input_error_in(exc)  # a Ray Train worker's, under Train's ControllerError or WorkerGroupError
        if error is None:
            raise
        _stop_ray_output()
        print(f"error: {error}", file=sys.stderr)
        return EXIT_INPUT_ERROR


if __name__ == "__main__":
    sys.exit(main())
