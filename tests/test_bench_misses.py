"""`bench.misses`: the proxy's uncached tokens add up, request by request, to what the upstream did not serve, each
part given a cause; a compaction is the only cause on a run whose client never changes its history."""

from __future__ import annotations

import asyncio

import pytest

from bench import misses
from tests.support.agent_run import TOOLS
from tests.support.format_agents import AGENTS
from tests.support.wire_formats import CHAT_COMPLETIONS

TURNS = 30
"""Two compactions of the chat agent's 4096-token window."""


@pytest.fixture(scope="module")
def run() -> tuple[list[misses.Request], int]:
    return asyncio.run(misses.through_proxy(AGENTS[CHAT_COMPLETIONS], TURNS, {}))


def test_every_uncached_token_has_one_cause(run: tuple[list[misses.Request], int]) -> None:
    requests, ceiling = run
    rows = misses.breakdown(CHAT_COMPLETIONS, requests, ceiling)
    assert len(rows) == len(requests) == TURNS
    for request, causes in zip(requests, rows, strict=True):
        assert sum(causes.tokens.values()) == request.usage.prompt - request.usage.cached
        broken = causes.tokens["compaction"] + causes.tokens["compaction, sooner"]
        assert (broken > 0) == request.decision.startswith("compacted"), (request.decision, causes.tokens)
    totals = misses.Causes()
    for causes in rows:
        totals.merge(causes)
    assert totals.tokens["first request"] == requests[0].usage.prompt
    assert totals.tokens["other"] == totals.tokens["tools changed"] == 0, totals.tokens


def test_a_tool_added_costs_what_the_request_kept_of_the_one_before(run: tuple[list[misses.Request], int]) -> None:
    requests, ceiling = run
    before, after = requests[1], requests[2]
    read = {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}
    changed = misses.Request({**after.body, "tools": [*TOOLS, read]}, after.usage, summary=False)
    unchanged, _above = misses.attribute(CHAT_COMPLETIONS, before, after, ceiling, sooner=False)
    causes, _above = misses.attribute(CHAT_COMPLETIONS, before, changed, ceiling, sooner=False)
    assert unchanged.tokens["tools changed"] == 0
    kept = {**changed.body, "messages": before.body["messages"]}
    assert causes.tokens["tools changed"] == misses.PROMPT_TOKENS[CHAT_COMPLETIONS](kept)
    assert sum(causes.tokens.values()) == after.usage.prompt - after.usage.cached
