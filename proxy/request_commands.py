"""`compaction-proxy count` and `compaction-proxy compact`: the engine run on one request body, no server.

Useful on their own (how big is this request? what would the proxy send?) and for debugging a compaction: both
read a request body from a file or stdin, a chat completion (`messages`) or a Responses API request (`input`), told
apart by its shape, and decide exactly as the proxy would on that request seen first: the same chain, offloading
included (the printed body holds the references and the read tool `serve` would add), deferring to a client that
compacts itself as far as the body shows it (`--client-compaction`; the headers a client sends are not in the body),
with no usage anchor or calibration, which only a running proxy learns.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from proxy.config import ClientCompaction, load_settings
from proxy.engine import (
    DEFAULT_CHAIN,
    STRATEGY_NAMES,
    ApproximateCounter,
    Thresholds,
    TokenCounter,
    Transcript,
    chain_by_names,
    compact_if_needed,
    counter_for_model,
)
from proxy.engine.messages import ROLES, Message
from proxy.engine.strategies.offload import ToolResultOffload, held_references
from proxy.formats import format_of_body
from proxy.pipeline.client_compaction import deferral
from proxy.pipeline.compacting import chain_names
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.offload.offloading import Offloading
from proxy.pipeline.offload.tool import with_read_tool
from proxy.pipeline.requests import InvalidRequest
from proxy.pipeline.wire import WireRequest
from proxy.state.memory import MemoryStore

USAGE_ERROR = 2

OFFLINE_STRATEGIES: Final = (*(name for name in STRATEGY_NAMES if name != "summarization"), ToolResultOffload.name)
"""The strategies `compact` can run: summarization needs the upstream, and these commands never call it."""


class CommandError(Exception):
    """A problem with the command's input, reported as one line and exit status 2."""


def add_count(subcommands: Any) -> None:
    """Register `count`: print the token count of a request body."""
    count = subcommands.add_parser(
        "count", help="print the token count of a request body (chat completion or Responses API)"
    )
    _add_common_arguments(count)
    count.set_defaults(handler=_reporting_errors(count_command))


def add_compact(subcommands: Any) -> None:
    """Register `compact`: print the compacted request body."""
    compact = subcommands.add_parser(
        "compact", help="print the request body the proxy would forward, compacted to fit the context window"
    )
    _add_common_arguments(compact)
    compact.add_argument("--context-window", type=int, required=True, help="the model's context window in tokens")
    compact.add_argument("--compact-at", metavar="FRACTION", help="fraction of the window that triggers (0.7)")
    compact.add_argument("--compact-to", metavar="FRACTION", help="fraction of the window to compact to (0.4)")
    compact.add_argument(
        "--strategies",
        metavar="A,B,...",
        help=f"the chain, comma-separated, in order, as `serve` takes it (default: {','.join(DEFAULT_CHAIN)}; one of"
        f" {', '.join(OFFLINE_STRATEGIES)})",
    )
    compact.add_argument(
        "--superseded-tools", metavar="A,B,...", help="tools whose older results a newer same-argument call supersedes"
    )
    compact.add_argument(
        "--user-text-share",
        metavar="FRACTION",
        help="share of the target the user's earlier messages may take in `user_message_window`, as `serve` takes it",
    )
    compact.add_argument(
        "--no-offload",
        action="store_true",
        help="plain pruning, as `serve --offload false` or `X-Compaction-Offload: off` (default: offload as `serve`"
        " does)",
    )
    compact.add_argument(
        "--client-compaction",
        choices=[policy.value for policy in ClientCompaction],
        help="for a client that compacts itself, as the body shows: auto defers to it (compacting only what would"
        " not fit the window), defer defers to any, ignore never does (auto)",
    )
    compact.set_defaults(handler=_reporting_errors(compact_command))


def _add_common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="the request body as JSON, or - for standard input")
    parser.add_argument(
        "--approximate", action="store_true", help="count with characters per token instead of tiktoken"
    )


def count_command(args: argparse.Namespace) -> int:
    """Print the request's token count on stdout, and its breakdown on stderr."""
    request, counter = _load(args)
    message_tokens = counter.messages_tokens(request.messages)
    overhead = counter.overhead_tokens(request.overhead_fields) + request.added_prompt_tokens
    print(message_tokens + overhead, file=sys.stdout)
    print(
        f"{len(request.messages)} messages: {message_tokens} tokens; tools and priming: {overhead} tokens "
        f"({counter.name})",
        file=sys.stderr,
    )
    return 0


def compact_command(args: argparse.Namespace) -> int:
    """Print the compacted request body on stdout, and one report line on stderr."""
    flags = {
        "compact_at": args.compact_at,
        "compact_to": args.compact_to,
        "strategies": args.strategies,
        "superseded_tools": args.superseded_tools,
        "user_text_share": args.user_text_share,
        "offload": False if args.no_offload else None,
        "client_compaction": args.client_compaction,
    }
    try:
        # The serve command's validation, so a bad fraction or chain gets the same one-line explanation.
        settings = load_settings(cli=flags, environ={})
        _check_offline(settings.strategies)
        base = chain_by_names(
            chain_names(settings.strategies),
            superseded_tools=settings.superseded_tools,
            user_text_share=settings.user_text_share,
        )
        request, counter = _load(args)
        thresholds = Thresholds(args.context_window, settings.compact_at, settings.compact_to, request.reserved_tokens)
    except ValueError as error:
        raise CommandError(str(error)) from None
    # Offloaded texts go to a store thrown away at exit: the body printed is the one `serve` forwards.
    _, chain = Offloading(settings, MemoryStore(), base, CompactionMetrics).for_request(request, args.wire, off=False)
    deferred, _ = deferral(settings.client_compaction, {}, request, thresholds.trigger_tokens)
    thresholds = replace(thresholds, client_compacts=deferred is not None)
    transcript = Transcript(request.messages, counter)
    outcome = compact_if_needed(
        transcript, thresholds, chain, counter.overhead_tokens(request.overhead_fields) + request.added_prompt_tokens
    )
    result = outcome.result
    if result is None:
        sys.stdout.write(args.raw.decode("utf-8", "replace"))
        state = "under the trigger" if not outcome.decision.compact else "nothing could be removed"
        if deferred is not None and not outcome.decision.compact:
            state = f"deferred to the client's own compaction: {deferred.signal}"
        print(f"tokens {outcome.decision.estimated_tokens}: unchanged ({state})", file=sys.stderr)
        return 0
    messages = result.plan.apply_messages(request.messages)
    offloaded = held_references(result.compacted.meta)
    if offloaded:
        request = with_read_tool(request, args.wire.read_tool)
    sys.stdout.write(request.forwarded(args.raw, messages).body.decode())
    sys.stdout.write("\n")
    replaced = sum(1 for entry in result.plan.created() if entry.replaces is not None)
    print(
        f"tokens {outcome.decision.estimated_tokens} -> {outcome.tokens_after} "
        f"(target {outcome.decision.target_tokens + outcome.decision.overhead_tokens}, window "
        f"{thresholds.context_window}); strategies: {', '.join(result.strategies)}; "
        f"removed {result.plan.removed_count()} messages, replaced {replaced}, offloaded {len(offloaded)}",
        file=sys.stderr,
    )
    return 0


def _check_offline(strategies: list[str]) -> None:
    """Refuse a chain `compact` cannot run: a name no strategy has, or summarization, which needs the upstream."""
    choices = f"choose from {', '.join(OFFLINE_STRATEGIES)}"
    unknown = [name for name in strategies if name not in (*STRATEGY_NAMES, ToolResultOffload.name)]
    if unknown:
        raise CommandError(f"--strategies: unknown strategy {', '.join(unknown)}; {choices}")
    online = [name for name in strategies if name not in OFFLINE_STRATEGIES]
    if online:
        raise CommandError(f"--strategies: {', '.join(online)} cannot run offline (it asks the upstream); {choices}")


def _check_messages(messages: list[Message]) -> None:
    """Refuse a message no provider takes: a role it does not know, or content that is not text, parts or null.

    The proxy forwards such a request untouched for the provider to refuse; these commands say so at once.
    """
    for position, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in ROLES:
            raise CommandError(f"message {position}: role {role!r} is not one of {', '.join(sorted(ROLES))}")
        if content is not None and not isinstance(content, str | list):
            kind = type(content).__name__
            raise CommandError(f"message {position}: content must be a string, a list of parts or null, not {kind}")


def _load(args: argparse.Namespace) -> tuple[WireRequest, TokenCounter]:
    try:
        raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
    except OSError as error:
        raise CommandError(f"cannot read {args.file}: {error.strerror}") from None
    args.raw, args.wire = raw, format_of_body(raw)
    try:
        request = args.wire.parse(raw, None)
    except InvalidRequest as error:
        raise CommandError(str(error)) from None
    _check_messages(request.messages)
    counter: TokenCounter = ApproximateCounter() if args.approximate else counter_for_model(request.model)
    return request, counter


def _reporting_errors(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """The command, with input problems turned into one line on stderr and exit status 2 (no traceback)."""

    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except CommandError as error:
            print(f"compaction-proxy {args.command}: error: {error}", file=sys.stderr)
            return USAGE_ERROR

    return run
