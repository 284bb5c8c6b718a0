"""The long run of each format through the proxy and straight at the upstream: cached shares, and what the proxy's
uncached tokens were spent on, request by request.

    python -m bench.misses [--turns 200] [--settings "compact_to=0.3"] [--markdown]

Each format's tool-using agent of the end-to-end long runs (`tests.support.format_agents`: chat completions,
Responses, Messages, each on its official SDK) runs `--turns` model calls through the real proxy (in this process,
on a loopback port) in front of its format's fake upstream, and once more straight at a fresh upstream until that
refuses a turn as too long. The cached share of each is the prompt tokens the upstream's prompt cache served over
the prompt tokens it counted, over the turns both complete (the proxy's summary calls made before the last of them
included, as `bench.billing.first_turns` takes them), and over the proxy's whole run.

The proxy's uncached tokens are attributed, request by request, to one cause each part (`Causes`), by comparing
what was forwarded with the request before it and counting tokens as the fake upstream counts them:

- `new messages`: the entries the request adds to the one before (never cached, direct or not), and, on a request
  that extends the one before, what the cache cannot serve of the rest (its last partial block, or all of a prompt
  under the cache's minimum);
- `first request`: all of the conversation's first request;
- `tools changed`: the tools differ from the request before's (the read tool came or went): every cache orders
  tools first, so what the request keeps of the one before was not served either;
- `compaction`: the prompt from the entry the proxy's rewrite changed on, on a compacting turn;
- `compaction, sooner`: the same, on a compaction that came back before it had to, because the one before left the
  prompt above `compact_to` of the window by more than `OVER_TARGET` of it (it removed too little);
- `summary call`: a summary call's instruction and what its prompt holds beyond the cached blocks;
- `other`: what none of these explains (the prefix changed without a compaction, or the cache missed).

These agents repeat their tool results, so the proxy never offloads and the read tool never comes or goes; the same
attribution on conversations where it does is `bench.misses_recall`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Final

import anthropic
import openai

from bench.long_run import proxy_settings
from proxy.config import Settings
from proxy.simulator.anthropic_rules import prompt_segments
from proxy.simulator.anthropic_upstream import AnthropicUpstream
from proxy.simulator.openai_tokens import count_prompt_tokens, encoding_name_for_model
from proxy.simulator.openai_upstream import OpenAIUpstream
from proxy.simulator.responses_tokens import prompt_sequence, visible_items
from tests.support.format_agents import AGENTS, FormatAgent, is_summary_request
from tests.support.proxies import LoopbackProxies
from tests.support.wire_formats import CHAT_COMPLETIONS, MESSAGES, RESPONSES, FormatCase, Upstream

TURNS: Final = 200
CAUSES: Final = (
    "new messages",
    "first request",
    "tools changed",
    "compaction",
    "compaction, sooner",
    "summary call",
    "other",
)
"""Every cause an uncached token is attributed to, in the order the report lists them."""
OVER_TARGET: Final = 0.02
"""How far above its target, as a share of the window, a compaction may leave the prompt before it counts as having
removed too little: the proxy aims with its own tokenizer, the upstream counts with its own rendering."""

Body = Mapping[str, Any]


def _chat_tokens(body: Body) -> int:
    return count_prompt_tokens(body)


def _responses_tokens(body: Body) -> int:
    encoding = encoding_name_for_model(str(body.get("model") or ""))
    items = visible_items(body.get("input") or [])
    return len(prompt_sequence(body.get("instructions"), body.get("tools") or [], items, encoding))


def _messages_tokens(body: Body) -> int:
    return sum(segment.tokens for segment in prompt_segments(body, body.get("messages") or []))


PROMPT_TOKENS: Final[dict[FormatCase, Callable[[Body], int]]] = {
    CHAT_COMPLETIONS: _chat_tokens,
    RESPONSES: _responses_tokens,
    MESSAGES: _messages_tokens,
}
"""A body's prompt tokens as the format's fake upstream counts them."""


@dataclass(frozen=True)
class Usage:
    """What the upstream billed for one request: its prompt tokens and, of them, those its cache served."""

    prompt: int
    cached: int


def usages(wire: FormatCase, upstream: Upstream) -> list[Usage]:
    """Every answered request's usage, in order."""
    if isinstance(upstream, AnthropicUpstream):
        return [
            Usage(
                u["input_tokens"] + u["cache_creation_input_tokens"] + u["cache_read_input_tokens"],
                u["cache_read_input_tokens"],
            )
            for u in upstream.usages
        ]
    if wire is RESPONSES:
        return [Usage(u["input_tokens"], u["input_tokens_details"]["cached_tokens"]) for u in upstream.responses_usages]
    return [Usage(u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]) for u in upstream.usages]


def share(figures: Sequence[Usage]) -> float:
    """The cached share of some requests' prompt tokens."""
    prompt = sum(usage.prompt for usage in figures)
    return sum(usage.cached for usage in figures) / prompt if prompt else 0.0


@dataclass
class Request:
    """One forwarded request: its body, usage, whether it was a summary call, and its turn's `X-Compaction`."""

    body: dict[str, Any]
    usage: Usage
    summary: bool
    decision: str = ""


@dataclass
class Causes:
    """Uncached tokens by cause (`CAUSES`), over one request or many."""

    tokens: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))

    def add(self, cause: str, count: int) -> int:
        """Attribute `count` tokens (at least 0) to `cause`; returns how many."""
        count = max(count, 0)
        self.tokens[cause] += count
        return count

    def merge(self, other: Causes) -> None:
        """Add another's tokens to these."""
        for cause, count in other.tokens.items():
            self.tokens[cause] += count


def _tail_start(previous: Sequence[Any], current: Sequence[Any]) -> int:
    """Where the entries `current` adds to `previous` begin: after its last entry `previous` also holds."""
    start = len(current)
    while start and current[start - 1] not in previous:
        start -= 1
    return start


def _common(previous: Sequence[Any], current: Sequence[Any]) -> int:
    """How many leading entries two requests share."""
    count = 0
    for before, after in zip(previous, current, strict=False):
        if before != after:
            break
        count += 1
    return count


def attribute(
    wire: FormatCase, previous: Request | None, request: Request, ceiling: int, sooner: bool
) -> tuple[Causes, bool]:
    """The request's uncached tokens by cause, and whether it was a compaction that left the prompt above `ceiling`.

    :param previous: The conversation's turn before (summary calls aside), None for its first request.
    :param ceiling: The prompt a compaction leaves at most without having removed too little (`OVER_TARGET`).
    :param sooner: Whether the compaction before this request left the prompt above the ceiling.
    """
    causes = Causes()
    uncached = request.usage.prompt - request.usage.cached
    compacted = request.decision.startswith("compacted")
    if request.summary:
        causes.add("summary call", uncached)
        return causes, False
    if previous is None:
        causes.add("first request", uncached)
        return causes, False
    count = PROMPT_TOKENS[wire]
    entries = wire.comparable_entries(request.body[wire.entries])
    before = wire.comparable_entries(previous.body[wire.entries])
    tail = _tail_start(before, entries)
    with_entries = {**request.body, wire.entries: request.body[wire.entries][:tail]}
    uncached -= causes.add("new messages", min(uncached, request.usage.prompt - count(with_entries)))
    kept = _common(before, entries)
    if request.body.get("tools") != previous.body.get("tools"):
        head = {**request.body, wire.entries: request.body[wire.entries][:kept]}
        uncached -= causes.add("tools changed", min(uncached, count(head)))
    if kept == len(before):
        causes.add("new messages", uncached)
    elif compacted:
        causes.add("compaction, sooner" if sooner else "compaction", uncached)
    else:
        causes.add("other", uncached)
    return causes, compacted and request.usage.prompt > ceiling


def breakdown(wire: FormatCase, requests: Sequence[Request], ceiling: int) -> list[Causes]:
    """Each request's uncached tokens by cause (`attribute`)."""
    previous: Request | None = None
    sooner = False
    rows = []
    for request in requests:
        causes, above = attribute(wire, previous, request, ceiling, sooner)
        rows.append(causes)
        if not request.summary:
            previous = request
            sooner = above if request.decision.startswith("compacted") else sooner
    return rows


def _endpoint(url: str, port: int) -> Any:
    """What an agent needs of where it sends its requests (`RunningProxy`'s `url` and `server.port`)."""
    return SimpleNamespace(url=url, server=SimpleNamespace(port=port))


def _upstream(agent: FormatAgent) -> Upstream:
    upstream: Upstream = AnthropicUpstream() if agent.wire is MESSAGES else OpenAIUpstream()
    upstream.context_window = agent.window
    return upstream


async def direct(agent: FormatAgent, turns: int) -> list[Usage]:
    """The agent straight at a fresh upstream until it refuses a turn as too long: each turn's usage."""
    async with _upstream(agent) as upstream:
        agent.install(upstream, summary="")
        endpoint = _endpoint(upstream.base_url + "/v1", int(upstream.base_url.rsplit(":", 1)[1]))
        with contextlib.suppress(openai.BadRequestError, anthropic.BadRequestError):  # the turn that overflowed
            await agent.run(endpoint, turns, lambda _turn: False)
        return usages(agent.wire, upstream)


async def through_proxy(agent: FormatAgent, turns: int, settings: Mapping[str, Any]) -> tuple[list[Request], int]:
    """The agent through a fresh proxy: every forwarded request, and the prompt a compaction leaves at most (in
    tokens) without having removed too little."""
    wire = agent.wire
    async with _upstream(agent) as upstream:
        agent.install(upstream, summary="The work so far: files read, nothing found.")
        proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={wire.model: agent.window})
        try:
            proxy = await proxies.start(**settings)
            decisions = await agent.run(proxy, turns, lambda _turn: False)
        finally:
            await proxies.close()
        return forwarded(wire, upstream, decisions), ceiling_of(proxy.settings, agent.window)


def ceiling_of(settings: Settings, window: int) -> int:
    """The prompt a compaction leaves at most, in tokens, without having removed too little (`OVER_TARGET`)."""
    return int((settings.compact_to + OVER_TARGET) * window)


def forwarded(wire: FormatCase, upstream: Upstream, decisions: Sequence[str]) -> list[Request]:
    """What the upstream was sent and billed, request by request, with each client turn's `X-Compaction`."""
    turns = iter(decisions)
    requests = []
    for raw, usage in zip(wire.forwarded(upstream), usages(wire, upstream), strict=True):
        body = json.loads(raw)
        summary = is_summary_request(wire, body)
        requests.append(Request(body, usage, summary, "" if summary else next(turns)))
    return requests


def first_turns(requests: Sequence[Request], turns: int) -> list[Request]:
    """The requests of the first `turns` turns, with the summary calls made before the last of them."""
    kept: list[Request] = []
    seen = 0
    for request in requests:
        if not request.summary:
            if seen == turns:
                break
            seen += 1
        kept.append(request)
    return kept


async def measure(turns: int, settings: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per format: the cached shares direct and through the proxy, and the proxy's misses by cause."""
    rows = []
    for agent in AGENTS.values():
        went_direct = await direct(agent, turns)
        requests, ceiling = await through_proxy(agent, turns, settings)
        both = first_turns(requests, len(went_direct))
        total, over_both = Causes(), Causes()
        for index, causes in enumerate(breakdown(agent.wire, requests, ceiling)):
            total.merge(causes)
            if index < len(both):
                over_both.merge(causes)
        rows.append(
            {
                "format": agent.wire.name,
                "window": agent.window,
                "direct_turns": len(went_direct),
                "direct_cached_share": share(went_direct),
                "direct_uncached": sum(usage.prompt - usage.cached for usage in went_direct),
                "proxy_cached_share_same_turns": share([request.usage for request in both]),
                "proxy_turns": sum(not request.summary for request in requests),
                "proxy_compactions": sum(request.decision.startswith("compacted") for request in requests),
                "proxy_summary_calls": sum(request.summary for request in requests),
                "proxy_cached_share": share([request.usage for request in requests]),
                "uncached_by_cause_same_turns": over_both.tokens,
                "uncached_by_cause": total.tokens,
            }
        )
    return rows


def markdown(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The shares, then the proxy's uncached tokens by cause, over the turns both complete and over its whole run."""
    lines = [
        "| format | window | direct: turns until it overflowed, cached | proxy, same turns: cached | gap "
        "| uncached, same turns: direct / proxy | proxy, whole run: turns, compactions, cached |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        gap = row["direct_cached_share"] - row["proxy_cached_share_same_turns"]
        uncached = sum(row["uncached_by_cause_same_turns"].values())
        lines.append(
            f"| {row['format']} | {row['window']} | {row['direct_turns']}, {row['direct_cached_share']:.1%} "
            f"| {row['proxy_cached_share_same_turns']:.1%} | {gap * 100:.1f} points "
            f"| {row['direct_uncached']} / {uncached} "
            f"| {row['proxy_turns']}, {row['proxy_compactions']}, {row['proxy_cached_share']:.1%} |"
        )
    lines += ["", f"| proxy's uncached tokens: same turns / whole run | {' | '.join(CAUSES)} |"]
    lines.append("| --- |" + " ---: |" * len(CAUSES))
    for row in rows:
        same, whole = row["uncached_by_cause_same_turns"], row["uncached_by_cause"]
        cells = " | ".join(f"{same[cause]} / {whole[cause]}" for cause in CAUSES)
        lines.append(f"| {row['format']} | {cells} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure every format, print JSON or the markdown tables."""
    parser = argparse.ArgumentParser(prog="python -m bench.misses", description=__doc__)
    parser.add_argument("--turns", type=int, default=TURNS, help="model calls of each run through the proxy")
    parser.add_argument("--settings", type=proxy_settings, default={}, help='proxy settings, e.g. "compact_to=0.3"')
    parser.add_argument("--markdown", action="store_true", help="print the tables, not JSON")
    options = parser.parse_args(argv)
    Settings(**options.settings)  # fails early, before any run, on a setting the proxy would refuse
    rows = asyncio.run(measure(options.turns, options.settings))
    print("\n".join(markdown(rows)) if options.markdown else json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
