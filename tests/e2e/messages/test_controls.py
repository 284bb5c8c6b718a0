"""The Messages API's own controls through the real proxy: an SDK agent's overflow retried, errors passed byte for
byte, refusals in the API's shape, and who the caller and conversation are.

The controls every format shares (the off switch, observe mode, windows, the overflow retry, tenants, metrics) are
tested for this format too, in `tests/e2e/test_controls.py`.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest

from proxy.config import Settings
from proxy.server.logging import ACCESS_LOGGER
from proxy.simulator.anthropic_upstream import AnthropicUpstream
from tests.e2e.messages.conftest import NON_BINDING, base_url, sdk
from tests.support.anthropic_agent import SYSTEM, TOOLS, run_agent
from tests.support.proxies import LoopbackProxies

HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01", "content-type": "application/json"}


def long_body(pairs: int = 24, words: int = 600) -> dict[str, Any]:
    """A conversation over the proxy's trigger (70% of the window) and under the window: about 1,200 tokens a pair."""
    messages: list[dict[str, Any]] = []
    for turn in range(pairs):
        messages.append({"role": "user", "content": f"Question {turn}: " + "detail " * words})
        messages.append({"role": "assistant", "content": f"Answer {turn}: " + "point " * words})
    messages.append({"role": "user", "content": "Go on."})
    return {"model": NON_BINDING, "max_tokens": 512, "system": SYSTEM, "tools": TOOLS, "messages": messages}


async def post(url: str, body: dict[str, Any], **headers: str) -> tuple[int, dict[str, str], bytes]:
    """POST a body to `url` + `/v1/messages` with plain aiohttp: the status, the headers and the body's bytes."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(url + "/v1/messages", data=orjson.dumps(body), headers={**HEADERS, **headers}) as response,
    ):
        return response.status, dict(response.headers), await response.read()


@pytest.mark.parametrize("streamed", [False, True], ids=["json", "stream"])
async def test_an_overflow_is_compacted_and_retried_once(upstream: AnthropicUpstream, streamed: bool) -> None:
    """The proxy does not know the window (the table says 200k): the upstream's overflow text teaches it."""
    proxies = LoopbackProxies(upstream=upstream.base_url)
    proxy = await proxies.start()
    try:
        async with sdk(proxy) as client:
            run = await run_agent(client, NON_BINDING, 110, lambda turn: streamed)
    finally:
        await proxies.close()
    assert run.decisions.count("compacted-after-overflow") == 1
    assert [rejection["error"]["message"].split(":")[0] for rejection in upstream.rejections] == ["prompt is too long"]
    retried = run.decisions.index("compacted-after-overflow")
    assert retried > 0 and "error" not in run.decisions


async def test_an_upstream_error_reaches_the_client_byte_for_byte(
    upstream: AnthropicUpstream, proxies: LoopbackProxies
) -> None:
    proxy = await proxies.start()
    unpaired = {
        "model": NON_BINDING,
        "max_tokens": 100,
        "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]}],
    }
    over = long_body(pairs=40)
    for body, extra in ((unpaired, {}), (over, {"X-Compaction": "off"})):
        direct = await post(upstream.base_url, body)
        through = await post(base_url(proxy), body, **extra)
        assert direct[0] == through[0] == 400
        assert through[2] == direct[2]


async def test_a_request_over_the_proxys_limits_is_refused_in_the_apis_error_shape(
    proxies: LoopbackProxies,
) -> None:
    proxy = await proxies.start(max_messages=10)
    async with sdk(proxy) as client:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(**long_body(pairs=8))
    body: Any = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "10" in body["error"]["message"]


async def test_count_tokens_passes_through_untouched(upstream: AnthropicUpstream, proxies: LoopbackProxies) -> None:
    proxy = await proxies.start()
    body = long_body(pairs=40)
    del body["max_tokens"]
    async with sdk(proxy) as client, sdk(upstream) as direct:
        assert (await client.messages.count_tokens(**body)) == (await direct.messages.count_tokens(**body))


async def test_claude_codes_session_header_names_the_conversation(
    proxies: LoopbackProxies, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = await proxies.start()
    with caplog.at_level(logging.INFO, logger=ACCESS_LOGGER):
        status, _, _ = await post(base_url(proxy), long_body(pairs=1), **{"x-claude-code-session-id": "session-7"})
    assert status == 200
    fields = [getattr(record, "fields", {}) for record in caplog.records if record.name == ACCESS_LOGGER]
    assert [entry.get("conversation_id") for entry in fields] == ["session-7"]


def test_x_api_key_scopes_the_tenant() -> None:
    settings = Settings(tenant_key="a-tenant-key-for-tests-only")
    tenants = {settings.tenant_of({"x-api-key": key}) for key in ("sk-ant-one", "sk-ant-two", "")}
    assert len(tenants) == 3


async def test_an_error_inside_a_stream_reaches_the_client_byte_for_byte(
    upstream: AnthropicUpstream, proxies: LoopbackProxies
) -> None:
    """A failure after the stream began (the API's `overloaded_error`) is no overflow: relayed as it came."""
    upstream.stream_error = {"type": "overloaded_error", "message": "Overloaded"}
    proxy = await proxies.start()
    body = {**long_body(), "stream": True}
    direct = await post(upstream.base_url, body, **{"X-Compaction": "off"})
    through = await post(base_url(proxy), body)
    assert through[0] == direct[0] == 200
    assert through[1]["X-Compaction"] == "compacted"
    relayed, sent = through[2].split(b"\n\n"), direct[2].split(b"\n\n")
    assert [event.split(b"\n")[0] for event in relayed] == [event.split(b"\n")[0] for event in sent]
    assert relayed[-2] == sent[-2] and relayed[-2].startswith(b"event: error"), "the error event as it came"
    async with sdk(proxy) as client:
        with pytest.raises(anthropic.APIStatusError, match="Overloaded"):
            async with client.messages.stream(**long_body()) as stream:
                await stream.get_final_message()


async def test_claude_codes_beta_query_is_kept_and_its_request_compacted(
    upstream: AnthropicUpstream, proxies: LoopbackProxies
) -> None:
    """Claude Code posts to `/v1/messages?beta=true` with betas of its own."""
    proxy = await proxies.start()
    betas = {"anthropic-beta": "context-management-2025-06-27"}
    async with aiohttp.ClientSession() as http:
        url = base_url(proxy) + "/v1/messages?beta=true"
        async with http.post(url, data=orjson.dumps(long_body()), headers={**HEADERS, **betas}) as response:
            assert response.status == 200
            assert response.headers["X-Compaction"] == "compacted"
    assert upstream.targets[-1] == "/v1/messages?beta=true"
    assert upstream.headers[-1]["anthropic-beta"] == betas["anthropic-beta"]
