"""The Messages API through the real proxy with the official `anthropic` SDK, against the strict fake upstream.

A tool-using agent with extended thinking whose conversation overflows a 32k window going direct runs 200 turns
through the proxy, streamed and not, on a model that binds thinking to its prefix and one that does not: no error, no
upstream rejection, most of the prompt read from the cache turn after turn, and the thinking produced since the last
compaction sent back to the model (on the binding model, the proxy keeps what each block was bound to).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from proxy.simulator.anthropic_upstream import AnthropicUpstream
from tests.e2e.messages.conftest import BINDING, NON_BINDING, WINDOW, sdk
from tests.support.anthropic_agent import run_agent
from tests.support.proxies import LoopbackProxies

TURNS = 200


STREAMING: dict[str, Any] = {
    "json": lambda turn: False,
    "stream": lambda turn: True,
}


@pytest.mark.parametrize("streaming", list(STREAMING))
@pytest.mark.parametrize("model", [NON_BINDING, BINDING])
async def test_a_conversation_that_overflows_going_direct_runs_200_turns_through_the_proxy(
    upstream: AnthropicUpstream, proxies: LoopbackProxies, model: str, streaming: str
) -> None:
    proxy = await proxies.start()
    started = time.perf_counter()
    async with sdk(proxy) as client:
        run = await run_agent(client, model, TURNS, STREAMING[streaming])
    seconds = time.perf_counter() - started
    thinking_back = sum(
        1
        for message in upstream.requests[-1]["messages"]
        if message["role"] == "assistant"
        for block in message["content"]
        if block["type"] == "thinking"
    )
    print(
        f"\n{model} {streaming}: {TURNS} turns in {seconds:.1f} s, {run.cached_share:.1%} of"
        f" {run.prompt} prompt tokens read from the cache, {run.decisions.count('compacted')} compactions,"
        f" {upstream.dropped_thinking} thinking blocks dropped upstream, {thinking_back} sent back in the last request"
    )
    assert upstream.rejections == []
    assert "compacted" in run.decisions, "the conversation never needed compacting: the test proves nothing"
    assert run.cached_share >= 0.8, f"only {run.cached_share:.0%} of the prompt was read from the cache"
    # More than the turn being continued (three messages at most): what the model thought since a compaction.
    assert thinking_back > 3, "the thinking produced after a compaction did not come back to the model"
    body = run.body(model)
    del body["max_tokens"]
    # The history as the client holds it: its thinking was bound to what the proxy sent, which the API's prefix check
    # refuses going direct; dropping such blocks, as the API can be told to, counts the rest.
    body["thinking"] = {**body["thinking"], "block_binding": {"prefix_mismatch_behavior": "drop_block"}}
    async with sdk(upstream) as direct:
        beta = {"anthropic-beta": "thinking-binding-controls-2026-08-01"}
        counted = await direct.messages.count_tokens(**body, extra_headers=beta)
    assert counted.input_tokens > WINDOW, "the conversation would not have overflowed going direct"
