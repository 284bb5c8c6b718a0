"""The `compaction-proxy` command line: one argparse subcommand per function pair (`add_<name>`, `run_<name>`).

A subcommand registers itself in `SUBCOMMANDS`: its `add_*` function adds a parser to the subparsers and sets
`handler=run_*`, which receives the parsed arguments and returns the exit status. Settings flags shared by
subcommands come from `add_settings_arguments` / `settings_from_args`.

Exit statuses: 0 success, 1 runtime failure (e.g. the port is taken), 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from proxy import __version__
from proxy.config import ConfigError, LogFormat, LogLevel, Mode, Settings, load_settings
from proxy.request_commands import add_compact, add_count

if TYPE_CHECKING:
    from proxy.chat.exchange import ChatCompaction

PROG = "compaction-proxy"


def fail(message: str, status: int = 2) -> int:
    """Print a one-line error the way argparse does and return the exit status."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return status


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the flags that override settings (each beats its `COMPACTION_PROXY_*` variable and the config file).

    Values stay strings here: the settings model validates them, so every bad value gets the same one-line error.
    The tenant key has no flag on purpose: a secret on a command line is visible to every local user.
    """
    group = parser.add_argument_group("settings (flags > COMPACTION_PROXY_* environment > config file > defaults)")
    group.add_argument("--config", metavar="PATH", help="YAML or JSON config file (env: COMPACTION_PROXY_CONFIG)")
    group.add_argument("--upstream", metavar="URL", help="provider base URL (default https://api.openai.com)")
    group.add_argument("--mode", choices=[mode.value for mode in Mode], help="enforce (default) or observe")
    group.add_argument("--compact-at", metavar="FRACTION", help="compact at this fraction of the window (0.7)")
    group.add_argument("--compact-to", metavar="FRACTION", help="compact down to this fraction (0.4)")
    group.add_argument("--strategies", metavar="A,B,...", help="compaction chain, comma-separated, in order")
    group.add_argument(
        "--context-window",
        metavar="MODEL=TOKENS",
        action="append",
        help="context window of a model (repeatable); replaces context_windows from lower sources",
    )
    group.add_argument("--default-context-window", metavar="TOKENS", help="window for models no table knows")
    group.add_argument("--conversation-header", metavar="NAME", help="header naming a conversation")
    group.add_argument("--state-url", metavar="URL", help="memory:// (default) or redis://host:port/db")
    group.add_argument("--state-ttl-seconds", metavar="SECONDS", help="idle conversation state lifetime")
    group.add_argument("--state-max-conversations", metavar="N", help="in-memory store bound")
    group.add_argument("--log-level", choices=[level.value for level in LogLevel], help="minimum log severity")
    group.add_argument("--log-format", choices=[fmt.value for fmt in LogFormat], help="json (default) or text")


def settings_from_args(args: argparse.Namespace, **extra: Any) -> Settings:
    """Load settings with the parsed flags on top (None means a flag was not given).

    :raises ConfigError: A value anywhere is invalid.
    """
    cli: dict[str, Any] = {
        "upstream": args.upstream,
        "mode": args.mode,
        "compact_at": args.compact_at,
        "compact_to": args.compact_to,
        "default_context_window": args.default_context_window,
        "conversation_header": args.conversation_header,
        "state_url": args.state_url,
        "state_ttl_seconds": args.state_ttl_seconds,
        "state_max_conversations": args.state_max_conversations,
        "log_level": args.log_level,
        "log_format": args.log_format,
        **extra,
    }
    if args.strategies is not None:
        cli["strategies"] = [name.strip() for name in args.strategies.split(",") if name.strip()]
    if args.context_window:
        windows: dict[str, str] = {}
        for item in args.context_window:
            model, sep, tokens = item.rpartition("=")
            if not sep or not model:
                raise ConfigError(
                    f"invalid setting 'context_windows' (from --context-window): expected MODEL=TOKENS, got {item!r}"
                )
            windows[model] = tokens
        cli["context_windows"] = windows
    return load_settings(cli=cli, config_file=args.config)


def build_chat_compaction(settings: Settings) -> ChatCompaction:
    """Return the compaction side for these settings: `proxy.chat.service` when present, else `PassThrough`."""
    try:
        service: Any = importlib.import_module("proxy.chat.service")
    except ModuleNotFoundError as exc:
        if exc.name != "proxy.chat.service":
            raise
        from proxy.chat.exchange import PassThrough

        return PassThrough()
    chat: ChatCompaction = service.build_chat_compaction(settings)
    return chat


def add_serve(subparsers: Any) -> None:
    """Register `serve`: run the proxy."""
    parser = subparsers.add_parser(
        "serve",
        help="run the proxy",
        description="Run the OpenAI-compatible compaction proxy until SIGTERM/SIGINT.",
    )
    parser.add_argument("--host", help="listen address (default 0.0.0.0)")
    parser.add_argument("--port", help="listen port (default 8080)")
    parser.add_argument("--max-body-bytes", metavar="BYTES", help="largest accepted request body (64 MiB)")
    parser.add_argument("--connect-timeout", metavar="SECONDS", help="upstream connect timeout (10)")
    parser.add_argument("--first-byte-timeout", metavar="SECONDS", help="upstream response-headers timeout (600)")
    parser.add_argument("--idle-timeout", metavar="SECONDS", help="upstream silence timeout within a body (300)")
    parser.add_argument("--shutdown-grace-seconds", metavar="SECONDS", help="in-flight grace on SIGTERM (30)")
    add_settings_arguments(parser)
    parser.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    """Load settings, build the compaction side, serve until signalled."""
    try:
        settings = settings_from_args(
            args,
            host=args.host,
            port=args.port,
            max_body_bytes=args.max_body_bytes,
            connect_timeout=args.connect_timeout,
            first_byte_timeout=args.first_byte_timeout,
            idle_timeout=args.idle_timeout,
            shutdown_grace_seconds=args.shutdown_grace_seconds,
        )
        chat = build_chat_compaction(settings)
    except (ConfigError, ValueError) as exc:
        return fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    from proxy.server.main import serve

    try:
        serve(settings, chat)
    except OSError as exc:
        return fail(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}", status=1)
    return 0


SUBCOMMANDS: list[Callable[[Any], None]] = [add_serve, add_count, add_compact]
"""Each entry adds one subcommand to the parser; append new ones here."""


def build_parser() -> argparse.ArgumentParser:
    """Return the full argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog=PROG, description="Keeps LLM conversations inside the context window.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
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
