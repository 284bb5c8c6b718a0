"""`compaction-proxy simulate` and `compaction-proxy demo`: argparse wiring for the simulated model and the demo.

Both follow `proxy.cli`'s pattern: `add_<name>` registers the subcommand with `handler=run_<name>`, which returns
the exit status (0 done, 1 could not run, 2 usage or configuration error).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any, Final

from proxy.config import ConfigError
from proxy.demo.conversations import FORMATS
from proxy.demo.session import DemoError, Plan, run
from proxy.settings_flags import settings_from_args
from proxy.simulator.model import DEFAULT_STEPS, DEFAULT_WINDOW, Simulator
from proxy.simulator.serving import cannot_listen, serve_until_signalled

DEFAULT_TURNS: Final = 40
"""Turns of the demo's agent: enough to pass the default window's trigger a few times."""

SIMULATE_PORT: Final = 8001


def _positive(text: str) -> int:
    """An argparse type: a positive integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _port(text: str) -> int:
    """An argparse type: a TCP port, 0 for a free one."""
    value = _positive(text) if text != "0" else 0
    if value > 65_535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (0 to 65535)")
    return value


def _add_window(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--window",
        type=_positive,
        default=DEFAULT_WINDOW,
        metavar="TOKENS",
        help=f"the simulated model's context window, for every model name (default: {DEFAULT_WINDOW:,})",
    )


def add_simulate(subparsers: Any) -> None:
    """Register `simulate`: serve the simulated model alone."""
    parser = subparsers.add_parser(
        "simulate",
        help="run a simulated model to try the proxy against (no provider, no network)",
        description=(
            "Serve a simulated model on loopback until Ctrl-C: OpenAI's chat completions and Responses API and"
            " Anthropic's Messages API, JSON and streamed. It counts tokens, reports usage with the cached tokens a"
            " prompt cache would give, calls the tools it is offered, and refuses a prompt over its window with the"
            " provider's own error. Point the proxy at it: compaction-proxy serve --upstream <printed URL>."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1)")
    parser.add_argument(
        "--port", type=_port, default=SIMULATE_PORT, help=f"port, 0 for a free one (default: {SIMULATE_PORT})"
    )
    _add_window(parser)
    parser.add_argument(
        "--steps",
        type=_positive,
        default=DEFAULT_STEPS,
        help=f"tool calls the model makes after each user message before answering (default: {DEFAULT_STEPS})",
    )
    parser.set_defaults(handler=run_simulate)


def run_simulate(args: argparse.Namespace) -> int:
    """Serve the simulated model until SIGINT or SIGTERM, after one line saying where and how to use it."""
    from proxy.cli import fail  # proxy.cli registers this command: imported here, not at the top

    simulator = Simulator(context_window=args.window, steps=args.steps, host=args.host, port=args.port)

    def announce(base_url: str) -> None:
        print(
            f"simulated model listening on {base_url} (chat completions, Responses, Messages; every model has a"
            f" {args.window:,}-token window). Try: compaction-proxy serve --upstream {base_url}",
            flush=True,
        )

    try:
        asyncio.run(serve_until_signalled(simulator, announce))
    except OSError as exc:
        return fail(cannot_listen(args.host, args.port, exc), status=1)
    return 0


def add_demo(subparsers: Any) -> None:
    """Register `demo`: the proxy in front of the simulated model, with an agent driving it."""
    parser = subparsers.add_parser(
        "demo",
        help="see the proxy work in a minute: an agent outgrows a simulated model's window through it",
        description=(
            "Start the simulated model and the proxy in front of it on loopback, drive a long tool-using agent"
            " through the proxy showing each turn (tokens sent against the window, compactions, the cached share,"
            " and the turn at which going direct would overflow), then keep the proxy and its dashboard running"
            " for your own client until Ctrl-C. The proxy reads the same COMPACTION_PROXY_* environment and"
            " --config file as serve."
        ),
    )
    parser.add_argument(
        "--turns", type=_positive, default=DEFAULT_TURNS, help=f"agent turns (default: {DEFAULT_TURNS})"
    )
    parser.add_argument(
        "--format", choices=tuple(FORMATS), default="chat", dest="wire_format", help="wire format (default: chat)"
    )
    parser.add_argument("--no-wait", action="store_true", help="exit after the run instead of serving until Ctrl-C")
    parser.add_argument("--port", type=_port, help="the proxy's port, 0 for a free one (default: 8080)")
    parser.add_argument("--config", metavar="PATH", help="YAML or JSON config file of the proxy's settings")
    _add_window(parser)
    parser.set_defaults(handler=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    """Run the demo (`proxy.demo.session`); exit 0 after Ctrl-C or, with `--no-wait`, after the run."""
    from proxy.cli import fail  # proxy.cli registers this command: imported here, not at the top

    try:
        settings = settings_from_args(args)
    except ConfigError as exc:
        return fail(str(exc).splitlines()[0])
    plan = Plan(settings, args.window, args.turns, args.wire_format, wait=not args.no_wait)
    try:
        asyncio.run(run(plan))
    except DemoError as exc:
        return fail(str(exc), status=1)
    return 0
