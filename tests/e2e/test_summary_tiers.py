"""Through the real proxy, a conversation compacted again keeps its compacted head, and the cache serves more of it.

The same tool-using agent runs twice, each time through its own proxy in front of its own OpenAI-like upstream
(whose prompt cache works by 128-token prefix blocks, as OpenAI's does): once with `summary_head_share` 0, where
every compaction rewrites the conversation from the instructions on, and once with the default, where a
conversation summarized before keeps everything through its newest summary byte for byte.
"""

from __future__ import annotations

import itertools
from typing import Any

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.conftest import MODEL
from tests.e2e.test_summary_prefix import settled_chat_agent
from tests.support.agent_run import agent_responder, is_summary_call
from tests.support.proxies import LoopbackProxies

WINDOW = 16_384
SUMMARY_OPENING = "<conversation_summary>"

Body = dict[str, Any]


async def _run(head_share: float | None) -> list[tuple[Body, dict[str, Any]]]:
    """The agent's run through a proxy with `head_share` (None: the default): each forwarded turn and its usage."""
    settings = {} if head_share is None else {"summary_head_share": head_share}
    async with OpenAIUpstream(agent_responder(), context_window=WINDOW) as upstream:
        proxies = LoopbackProxies(
            upstream=upstream.base_url,
            context_windows={MODEL: WINDOW},
            strategies=["summarization", "sliding_window", "middle_out"],
        )
        try:
            proxy = await proxies.start(**settings)
            await settled_chat_agent(proxy, tasks=3, result_lines=18)
        finally:
            await proxies.close()
        return list(zip((request.json for request in upstream.requests), upstream.usages, strict=True))


def _compacted(turns: list[Body]) -> list[list[Body]]:
    """The forwarded prompts a compaction produced: those not extending the one before."""
    prompts = [body["messages"] for body in turns]
    return [after for before, after in itertools.pairwise(prompts) if after[: len(before)] != before]


def _head(prompt: list[Body]) -> list[Body]:
    """A compacted prompt through its newest summary."""
    summaries = [
        index for index, message in enumerate(prompt) if str(message.get("content")).startswith(SUMMARY_OPENING)
    ]
    return prompt[: summaries[-1] + 1] if summaries else []


def _cached_share(run: list[tuple[Body, dict[str, Any]]]) -> float:
    prompt = sum(usage["prompt_tokens"] for _body, usage in run)
    return sum(usage["prompt_tokens_details"]["cached_tokens"] for _body, usage in run) / prompt


async def test_compacting_again_keeps_the_head_through_the_newest_summary_and_the_cache_serves_more() -> None:
    rewritten, tiered = await _run(0), await _run(None)

    kept = _heads_kept(tiered)
    assert len(kept) >= 3, f"{len(kept) + 1} compactions: too few to compact a compacted conversation"
    # This agent's summaries are short: its head never outgrows its share of the target, so it is never merged.
    assert all(kept), f"heads kept through later compactions: {kept}"
    assert not all(_heads_kept(rewritten)), "without tiers the head is rewritten: the comparison shows nothing"
    assert _cached_share(tiered) > _cached_share(rewritten) + 0.01
    assert max(usage["prompt_tokens"] for _body, usage in tiered) <= WINDOW


def _heads_kept(run: list[tuple[Body, dict[str, Any]]]) -> list[bool]:
    """For each compaction after the first: whether its prompt opens with the previous one's, through its summary."""
    compacted = _compacted([body for body, _usage in run if not is_summary_call(body)])
    assert all(_head(prompt) for prompt in compacted), "a compaction of this agent's run wrote no summary"
    return [after[: len(_head(before))] == _head(before) for before, after in itertools.pairwise(compacted)]
