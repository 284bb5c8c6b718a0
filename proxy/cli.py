"""The `compaction-proxy` command line: one argparse subcommand per function pair (`add_<name>`, `run_<name>`).

A subcommand registers itself in `SUBCOMMANDS`: its `add_*` function adds a parser to the subparsers and sets
`handler=run_*`, which receives the parsed arguments and returns the exit status. The settings flags are generated
from the settings model (`proxy.settings_flags`), so every setting has one. A usage error is one line on stderr.

Exit statuses: 0 success, 1 runtime failure (e.g. the port is taken), 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import typing
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from proxy import __version__
from proxy.config import ConfigError, Settings
from proxy.demo.commands import add_demo, add_simulate
from proxy.request_commands import add_compact, add_count
from proxy.settings_flags import add_settings_flags, settings_from_args

if TYPE_CHECKING:
    from proxy.pipeline.exchange import Compaction

PROG = "compaction-proxy"


def fail(message: str, status: int = 2) -> int:
    """Print a one-line error the way argparse does and return the exit status."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line pointing at `--help`, not the whole usage block."""

    def error(self, message: str) -> typing.NoReturn:
        """Print `<prog>: error: <message> (see <prog> --help)` and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_compaction(settings: Settings) -> Compaction:
    """Return the compaction side for these settings: `proxy.pipeline.routed` when present, else `PassThrough`."""
    try:
        routed: Any = importlib.import_module("proxy.pipeline.routed")
    except ModuleNotFoundError as exc:
        if exc.name != "proxy.pipeline.routed":
            raise
        from proxy.pipeline.exchange import PassThrough

        return PassThrough()
    compaction: Compaction = routed.build_pipeline(settings)
    return compaction


def add_serve(subparsers: Any) -> None:
    """Register `serve`: run the proxy."""
    parser = subparsers.add_parser(
        "serve",
        help="run the proxy",
        description="Run the OpenAI-compatible compaction proxy until SIGTERM/SIGINT.",
        usage="%(prog)s [--config PATH] [--<setting> VALUE ...]",
    )
    add_settings_flags(parser)
    parser.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    """Load settings, build the compaction side, serve until signalled (in `workers` processes when more than 1)."""
    try:
        settings = settings_from_args(args)
        compaction = build_compaction(settings)
    except (ConfigError, ValueError) as exc:
        return fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    from proxy.server.event_loop import EventLoopUnavailable, loop_factory
    from proxy.server.main import serve
    from proxy.server.workers import serve_workers

    try:
        loop_factory(settings.event_loop)
    except EventLoopUnavailable as exc:
        return fail(str(exc))
    try:
        if settings.workers > 1:
            return serve_workers(settings, compaction)
        serve(settings, compaction)
    except OSError as exc:
        return fail(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}", status=1)
    return 0


SUBCOMMANDS: list[Callable[[Any], None]] = [add_serve, add_count, add_compact, add_simulate, add_demo]
"""Each entry adds one subcommand to the parser; append new ones here."""


def build_parser() -> argparse.ArgumentParser:
    """Return the full argument parser with every registered subcommand."""
    parser = OneLineParser(prog=PROG, description="Keeps LLM conversations inside the context window.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=OneLineParser)
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `compaction-proxy` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
