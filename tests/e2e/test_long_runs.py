"""Long tool-using runs through the real proxy with each format's official SDK: nothing overflows, the forwarded
prefix stays stable between compactions, and most prompt tokens are read from the provider's cache.

The Messages API's own long runs (a model that binds thinking to its prefix, thinking sent back) are in
`tests/e2e/messages/test_long_runs.py`.
"""

from __future__ import annotations

import openai
import orjson
import pytest

from proxy.simulator.openai_upstream import OpenAIUpstream
from proxy.simulator.responses_api import responses_tool_loop_responder
from tests.support import responses_agent
from tests.support.format_agents import AGENTS
from tests.support.proxies import LoopbackProxies
from tests.support.wire_formats import RESPONSES, FormatCase, Upstream, by_format

TURNS = 200


@by_format()
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_200_turns_never_overflow_keep_the_prefix_and_the_cache_hitting(
    wire: FormatCase, format_upstream: Upstream, format_proxies: LoopbackProxies, stream: bool
) -> None:
    agent = AGENTS[wire]
    agent.install(format_upstream, summary="")
    format_upstream.context_window = agent.window
    proxy = await format_proxies.start(context_windows={wire.model: agent.window})
    headers = await agent.run(proxy, TURNS, lambda turn: stream)

    forwarded = wire.forwarded(format_upstream)
    assert len(forwarded) == len(headers) == TURNS
    compactions = headers.count("compacted")
    assert 1 <= compactions <= len(headers) * agent.compactions_share, f"{compactions} in {len(headers)} turns"
    assert "compacted-after-overflow" not in headers
    # Between two compactions each forwarded prompt extends the previous one: byte for byte where the client moves
    # no cache breakpoints, entry for entry (breakpoints aside) where it does.
    for previous, current, header in zip(forwarded, forwarded[1:], headers[1:], strict=False):
        if header == "compacted":
            continue
        if wire.moving_breakpoints:
            before, after = (
                wire.comparable_entries(orjson.loads(previous)[wire.entries]),
                wire.comparable_entries(orjson.loads(current)[wire.entries]),
            )
            assert after[: len(before)] == before, "a turn without compaction changed the forwarded prefix"
        else:
            before_bytes, after_bytes = wire.entries_bytes(previous), wire.entries_bytes(current)
            assert after_bytes.startswith(before_bytes[:-1]), "a turn without compaction changed the forwarded prefix"
    # Every forwarded request fitted the window, and the provider's prompt cache kept hitting.
    prompts = wire.upstream_prompt_tokens(format_upstream)
    assert len(prompts) == len(headers) and max(prompts) < agent.window
    cached = sum(agent.cached_tokens(format_upstream))
    share = cached / sum(prompts)
    print(f"\n{wire.name} ({'sse' if stream else 'json'}): {compactions} compactions, {share:.1%} cached")
    assert share > agent.cached_share, f"only {share:.0%} of the prompt tokens were read from the cache"


async def test_the_responses_agent_overflows_going_direct(openai_upstream: OpenAIUpstream) -> None:
    openai_upstream.context_window = AGENTS[RESPONSES].window
    openai_upstream.responses_responder = responses_tool_loop_responder(
        "read_file", steps=20, arguments=lambda step, _k: {"path": f"f{step}"}
    )
    base_url = openai_upstream.base_url + "/v1"
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as raised:
            await responses_agent.run_agent(client, TURNS, lambda turn: False)
    assert raised.value.code == "context_length_exceeded"
