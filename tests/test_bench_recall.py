"""The retention benchmark's "Must show" (issue 33), on a quick run through the real proxy and the fake upstreams.

Every conversation shape in every wire format at the 32k window, for the default chain, today's default chain
(pinned by name) and the keep-the-opening-and-latest baseline: the default keeps every requirement and correction
everywhere, at least as many facts as that baseline, bills no more than today's chain and reuses its prefix as well,
within 3 points.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import recall
from bench.recall_baselines import BASELINES, CLEARED, ClearOldToolResults
from bench.recall_scoring import CACHED_PRICES
from proxy.engine import ApproximateCounter, CompactionChain, Transcript
from proxy.engine.grouping import latest_user_index
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.engine.conversations import Conversation, assert_tool_pairs_intact, conversations
from tests.support.examples import examples
from tests.support.proxies import LoopbackProxies
from tests.support.wire_formats import CHAT_COMPLETIONS

OPENING = "keep opening and latest, old tool results cut to head and tail"
WINDOW = recall.WINDOWS[0]


@pytest.fixture(scope="module")
def results() -> list[recall.Result]:
    rows = [row for row in recall.rows() if row.label in (recall.TODAY_ROW, recall.DEFAULT_ROW, OPENING)]
    return asyncio.run(recall.measure(rows, [WINDOW], recall.QUICK_FILL))


def _of(results: Sequence[recall.Result], row: str) -> list[recall.Result]:
    return [result for result in results if result.row == row]


def test_the_default_keeps_every_requirement_and_correction_everywhere(results: list[recall.Result]) -> None:
    runs = _of(results, recall.DEFAULT_ROW)
    assert len(runs) == 9, "every shape in every format"
    for run in runs:
        for kind in ("requirement", "correction"):
            assert run.score.in_context[kind] == run.score.facts[kind], (run.shape, run.format, kind)


def test_the_default_keeps_as_many_facts_as_keeping_the_opening_and_latest(results: list[recall.Result]) -> None:
    ours, theirs = (recall.summary(results, row)["in_context"] for row in (recall.DEFAULT_ROW, OPENING))
    assert sum(ours.values()) >= sum(theirs.values()), (ours, theirs)


def test_the_default_bills_no_more_than_todays_chain(results: list[recall.Result]) -> None:
    ours, today = (recall.summary(results, row)["billed"] for row in (recall.DEFAULT_ROW, recall.TODAY_ROW))
    for price in CACHED_PRICES:
        assert ours[f"{price:g}x"] <= today[f"{price:g}x"], (price, ours, today)


def test_the_default_reuses_its_prefix_within_3_points_of_todays_chain(results: list[recall.Result]) -> None:
    ours, today = (recall.summary(results, row)["prefix_reuse"] for row in (recall.DEFAULT_ROW, recall.TODAY_ROW))
    assert ours >= today - 0.03, (ours, today)


async def test_a_proxy_given_a_chain_runs_it_in_place_of_its_settings() -> None:
    wire = CHAT_COMPLETIONS
    async with OpenAIUpstream(context_window=8192) as upstream:
        proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={wire.model: 8192})
        try:
            proxy = await proxies.start(CompactionChain([ClearOldToolResults(keep=1)]), offload=False)
            status, headers, _answer = await wire.post(proxy, wire.conversation(12, paragraphs=12))
        finally:
            await proxies.close()
    assert status == 200
    assert headers["X-Compaction-Strategies"] == ClearOldToolResults.name
    forwarded = wire.entries_of(wire.forwarded(upstream)[-1])
    results = [message["content"] for message in forwarded if message["role"] == "tool"]
    assert results.count(CLEARED) == len(results) - 1


@pytest.mark.parametrize("label", BASELINES)
@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversation=conversations(), fraction=st.floats(min_value=0.0, max_value=1.2))
def test_a_baseline_keeps_the_engines_invariants_and_the_same_input_gives_the_same_output(
    label: str, conversation: Conversation, fraction: float
) -> None:
    def compacted() -> list[dict[str, Any]] | None:
        messages, meta = copy.deepcopy((conversation.messages, conversation.meta))
        transcript = Transcript(messages, ApproximateCounter(), meta)
        result = BASELINES[label](recall.FILL_TO).compact(transcript, int(transcript.total() * fraction))
        return None if result is None else result.plan.apply_messages(messages)

    first = compacted()
    assert first == compacted()
    if first is not None:
        assert_tool_pairs_intact(first)
        task = latest_user_index(Transcript(conversation.messages, ApproximateCounter(), conversation.meta))
        assert task is None or conversation.messages[task] in first, "the latest user message was changed or removed"
