"""Summaries for Messages conversations on a model that binds thinking to its prefix: the summary call drops it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest
from anthropic import AsyncAnthropic

from proxy.formats.anthropic.rules import without_cache_control
from proxy.pipeline.summary_text import IN_CONTEXT_PREAMBLE
from proxy.simulator.anthropic_upstream import AnthropicUpstream, tool_loop_responder
from tests.e2e.messages.conftest import BINDING, NON_BINDING, WINDOW, base_url, sdk
from tests.e2e.messages.test_controls import long_body
from tests.e2e.test_summaries import settled
from tests.support.anthropic_agent import TOOLS, run_agent
from tests.support.proxies import LoopbackProxies

SUMMARY_MARK = IN_CONTEXT_PREAMBLE.split(":", 1)[0]
SUMMARY = "## Objective\n- review the modules\n## Work done\n- searched for tasks 1 to 20\n"


def is_summary_request(body: Mapping[str, Any]) -> bool:
    content = body["messages"][-1]["content"]
    return isinstance(content, str) and content.startswith(SUMMARY_MARK)


def summarizing(upstream: AnthropicUpstream, **settings: Any) -> LoopbackProxies:
    """Proxies in front of `upstream` that summarize, for conversations that fill `WINDOW`."""
    return LoopbackProxies(
        upstream=upstream.base_url,
        context_windows={"claude": WINDOW},
        strategies=["summarization", "sliding_window", "middle_out"],
        **settings,
    )


async def test_summaries_on_a_model_that_binds_thinking_drop_it_and_replace_their_span(
    upstream: AnthropicUpstream,
) -> None:
    """The case every format shares (a model that binds nothing) is in `tests/e2e/test_summaries.py`."""
    model = BINDING
    agent = tool_loop_responder("search", steps=2, words=60)
    upstream.responder = lambda body: [{"type": "text", "text": SUMMARY}] if is_summary_request(body) else agent(body)
    proxies = summarizing(upstream)
    try:
        proxy = await proxies.start()
        async with sdk(proxy) as client:
            run = await run_agent(client, model, 120, lambda turn: turn % 2 == 1)
        await settled(proxy)
        used = proxy.service.metrics.summaries_used._value.get()
    finally:
        await proxies.close()

    assert upstream.rejections == []
    summaries = [body for body in upstream.requests if is_summary_request(body)]
    forwarded = [without_cache_control(body) for body in upstream.requests if not is_summary_request(body)]
    assert len(forwarded) == len(run.decisions) and "compacted" in run.decisions
    assert summaries and used >= 1
    assert all(headers.get("anthropic-version") for headers in upstream.headers), "a call without the API version"
    for summary in summaries:
        assert summary["tools"][: len(TOOLS)] == TOOLS and summary["tool_choice"] == {"type": "none"}
        assert "stream" not in summary
        assert "thinking" not in str([m["content"] for m in summary["messages"] if m["role"] == "assistant"])
    assert any("searched for tasks 1 to 20" in str(body["messages"]) for body in forwarded), "no summary was used"


OPERATOR_KEY = "sk-ant-operator"
CALLER_KEY = "sk-ant-caller"
CALLER_TOKEN = "oauth-caller-token"
BETA = "interleaved-thinking-2025-05-14"


async def summary_headers(settings: dict[str, Any], headers: dict[str, str]) -> list[dict[str, str]]:
    """The headers of the summary calls the proxy makes for a conversation over its trigger sent with `headers`.

    The upstream accepts only the caller's and the operator's credentials, each in the header the API takes it in.
    """
    headers = {**headers, "anthropic-version": "2023-06-01", "content-type": "application/json"}
    async with AnthropicUpstream(
        context_window=WINDOW,
        api_keys=frozenset({CALLER_KEY, OPERATOR_KEY}),
        auth_tokens=frozenset({CALLER_TOKEN}),
    ) as upstream:
        upstream.responder = lambda body: [{"type": "text", "text": SUMMARY if is_summary_request(body) else "Done."}]
        proxies = summarizing(upstream, **settings)
        try:
            proxy = await proxies.start()
            async with (
                aiohttp.ClientSession() as http,
                http.post(f"{base_url(proxy)}/v1/messages", data=orjson.dumps(long_body()), headers=headers) as answer,
            ):
                assert answer.status == 200, await answer.read()
            await settled(proxy)
        finally:
            await proxies.close()
        assert upstream.rejections == []
        calls = [
            sent for body, sent in zip(upstream.requests, upstream.headers, strict=True) if is_summary_request(body)
        ]
    assert calls, "no summary call was made"
    return calls


async def test_a_summary_call_sends_the_operators_key_as_x_api_key() -> None:
    calls = await summary_headers({"summary_api_key": OPERATOR_KEY}, {"x-api-key": CALLER_KEY, "anthropic-beta": BETA})
    for sent in calls:
        assert sent["x-api-key"] == OPERATOR_KEY and "authorization" not in sent
        assert sent["anthropic-version"] == "2023-06-01" and sent["anthropic-beta"] == BETA


@pytest.mark.parametrize(
    ("credential", "value"),
    [("x-api-key", CALLER_KEY), ("authorization", f"Bearer {CALLER_TOKEN}")],
    ids=["x-api-key", "bearer"],
)
async def test_without_the_operators_key_a_summary_call_sends_the_callers_credential(
    credential: str, value: str
) -> None:
    calls = await summary_headers({}, {credential: value, "anthropic-beta": BETA})
    for sent in calls:
        assert sent[credential] == value
        assert sent["anthropic-version"] == "2023-06-01" and sent["anthropic-beta"] == BETA


async def test_the_upstream_refuses_a_key_sent_as_a_bearer_token() -> None:
    """The fake is as strict as the API: the check above cannot pass with the wrong header shape."""
    async with AnthropicUpstream(api_keys=frozenset({OPERATOR_KEY})) as upstream:
        client = AsyncAnthropic(base_url=upstream.base_url, auth_token=OPERATOR_KEY, api_key=None, max_retries=0)
        async with client:
            with pytest.raises(anthropic.AuthenticationError) as raised:
                await client.messages.create(
                    model=NON_BINDING, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
                )
    assert raised.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid x-api-key"},
    }
