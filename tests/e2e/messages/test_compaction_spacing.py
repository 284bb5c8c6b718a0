"""A compaction brings the conversation down to the target, and the next comes only once growth calls for it.

A Claude Code-like agent (the official `anthropic` SDK, its cache breakpoint moved to its newest message every turn,
tool calls, user turns of about 340 tokens) runs through the proxy in a 16k window. The upstream counts every
request the agent sends as it would going direct (`count_tokens`), so how much the conversation grew between two
turns is the upstream's own figure, and so is where each compaction landed (the prompt it reported). Each
compaction must land at the target, and each next one come only after the conversation grew back to the trigger
from where the one before landed: over the run, no more compactions than a proxy counting within its tolerance of
the upstream's counts would need.

Two ways the proxy once compacted sooner than that: the rewrite remembered on a compacting turn was not found on the
next when the client's user message came as a text block with its breakpoint, then as a string (each turn decided
again); and a user message of several text blocks (Claude Code's reminders beside the user's words) condensed by the
engine was forwarded with its first block replaced and the others kept, so the provider read more than the engine
counted and the compaction landed far above its target.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from proxy.simulator.anthropic_upstream import AnthropicUpstream
from tests.e2e.messages.conftest import NON_BINDING, sdk
from tests.support.anthropic_agent import run_agent
from tests.support.proxies import LoopbackProxies

WINDOW = 16_000
TURNS = 100
TOLERANCE = 0.02
"""How far the proxy's count may stand from the upstream's, as a share of the window (their tokenizers differ)."""

USER_WORDS = "details " * 340


@pytest.fixture
def window() -> int:
    """This module's window, for the folder's `upstream` and `proxies` fixtures."""
    return WINDOW


def words(turn: int) -> str:
    """The user's words opening a task, as a string: about 340 tokens."""
    return f"Task {turn}: " + USER_WORDS


def with_reminder(turn: int) -> list[Any]:
    """The same words after a reminder block, as Claude Code sends a user's turn."""
    return [
        {"type": "text", "text": "<system-reminder>The user opened src/app.py.</system-reminder>"},
        {"type": "text", "text": words(turn)},
    ]


TASKS = {"string": words, "blocks": with_reminder}


def most_compactions(sizes: list[int], trigger: float, target: float) -> int:
    """The compactions a conversation of these sizes needs at most: compacting as early as the tolerance allows,
    landing as high as it allows, and growing by the client's own growth between turns."""
    compactions, size = 0, float(sizes[0])
    for before, after in itertools.pairwise(sizes):
        size += after - before
        if size >= trigger:
            compactions, size = compactions + 1, target
    return compactions


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("task", list(TASKS))
async def test_compactions_land_at_the_target_and_come_back_only_as_the_conversation_grows(
    upstream: AnthropicUpstream, task: str, streamed: bool
) -> None:
    proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={"claude": WINDOW})
    sizes: list[int] = []

    async def count(turn: int, body: dict[str, Any]) -> None:
        async with sdk(upstream) as direct:
            counted = await direct.messages.count_tokens(**{k: v for k, v in body.items() if k != "max_tokens"})
        sizes.append(counted.input_tokens)

    try:
        proxy = await proxies.start()
        async with sdk(proxy) as client:
            run = await run_agent(client, NON_BINDING, TURNS, lambda turn: streamed, before=count, task=TASKS[task])
    finally:
        await proxies.close()

    assert upstream.rejections == []
    slack = TOLERANCE * WINDOW
    trigger, target = proxy.settings.compact_at * WINDOW, proxy.settings.compact_to * WINDOW
    prompts = [
        usage["input_tokens"] + usage["cache_creation_input_tokens"] + usage["cache_read_input_tokens"]
        for usage in upstream.usages
    ]
    compacted = [turn for turn, decision in enumerate(run.decisions) if decision == "compacted"]
    landed = [prompts[turn] for turn in compacted]
    print(
        f"\n{task} {'stream' if streamed else 'json'}: {len(compacted)} compactions at turns {compacted}, landing at"
        f" {landed} (target {target:.0f}), {run.cached_share:.3f} of {run.prompt} prompt tokens read from the cache"
    )
    assert compacted, "the conversation never needed compacting: the test proves nothing"
    assert all(prompt <= target + slack for prompt in landed), f"a compaction landed above the target {target:.0f}"
    for previous, turn in itertools.pairwise(compacted):
        grown = prompts[previous] + sizes[turn] - sizes[previous]
        assert grown >= trigger - slack, f"compacted at turn {turn}, {grown} tokens after turn {previous}'s"
    assert len(compacted) <= most_compactions(sizes, trigger - slack, target + slack)
