"""What the proxy answers itself on `/v1/messages` is in the Messages API's error shape, with the type the API
documents for the status (`{"type": "error", "error": {"type", "message"}}`), so the official `anthropic` SDK raises
the class it raises for the API's own errors, with the proxy's message: an upstream out of reach (502 `api_error`),
one that does not answer in time (504 `timeout_error`), a body over the proxy's limit (413 `request_too_large`), a
body that is not what its content coding says and a request over its limits (400), both `invalid_request_error`, and
a body that stalls (408). A chat request keeps OpenAI's shape on the same proxy.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import orjson
import pytest
from aiohttp import web

from proxy.simulator.anthropic_upstream import AnthropicUpstream
from tests.e2e.messages.conftest import NON_BINDING, sdk
from tests.reliability.test_client_faults import body_of, raw_exchange, status_of
from tests.support.proxies import LoopbackProxies, RunningProxy

QUESTION = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
async def proxies() -> AsyncIterator[LoopbackProxies]:
    """Starts proxies (each test names its upstream) and stops them after the test."""
    started = LoopbackProxies(upstream="http://127.0.0.1:9")
    yield started
    await started.close()


@pytest.fixture
async def silent_upstream() -> AsyncIterator[str]:
    """An upstream that accepts every request and never answers (until the test ends)."""
    done = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        await done.wait()
        return web.Response(status=204)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", hang)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    done.set()
    await runner.cleanup()


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def anthropic_error(raised: anthropic.APIStatusError) -> dict[str, Any]:
    """The error object of the body the SDK raised on, checked to be the Messages API's shape."""
    body = raised.body
    assert isinstance(body, dict) and body.get("type") == "error", body
    assert set(body["error"]) == {"type", "message"}
    return dict(body["error"])


async def create(proxy: RunningProxy, **options: Any) -> None:
    async with sdk(proxy) as client:
        await client.messages.create(model=NON_BINDING, max_tokens=16, **{"messages": QUESTION, **options})


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_an_unreachable_upstream_is_an_api_error(proxies: LoopbackProxies, stream: bool) -> None:
    proxy = await proxies.start(upstream=f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(anthropic.InternalServerError) as raised:
        await create(proxy, stream=stream)
    assert raised.value.status_code == 502
    error = anthropic_error(raised.value)
    assert error["type"] == "api_error"
    assert error["message"].startswith("The upstream could not be reached")
    assert "The upstream could not be reached" in str(raised.value)


async def test_an_upstream_that_does_not_answer_in_time_is_a_timeout_error(
    proxies: LoopbackProxies, silent_upstream: str
) -> None:
    proxy = await proxies.start(upstream=silent_upstream, first_byte_timeout=0.3)
    with pytest.raises(anthropic.GatewayTimeoutError) as raised:
        await create(proxy)
    error = anthropic_error(raised.value)
    assert error["type"] == "timeout_error"
    assert error["message"].startswith("The upstream timed out")


async def test_a_body_over_the_limit_is_request_too_large(proxies: LoopbackProxies) -> None:
    async with AnthropicUpstream() as upstream:
        proxy = await proxies.start(upstream=upstream.base_url, max_body_bytes=2048)
        with pytest.raises(anthropic.RequestTooLargeError) as raised:
            await create(proxy, messages=[{"role": "user", "content": "word " * 1000}])
        assert upstream.requests == []
    error = anthropic_error(raised.value)
    assert error["type"] == "request_too_large"
    assert "exceeds the proxy's limit of 2048 bytes" in error["message"]


async def test_a_request_over_the_proxys_limits_is_an_invalid_request_error(proxies: LoopbackProxies) -> None:
    async with AnthropicUpstream() as upstream:
        proxy = await proxies.start(upstream=upstream.base_url, max_messages=2)
        messages = [*QUESTION, {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again."}]
        with pytest.raises(anthropic.BadRequestError) as raised:
            await create(proxy, messages=messages)
        assert upstream.requests == []
    error = anthropic_error(raised.value)
    assert error["type"] == "invalid_request_error"
    assert "messages" in error["message"]


async def test_a_body_not_in_its_content_coding_is_an_invalid_request_error(proxies: LoopbackProxies) -> None:
    async with AnthropicUpstream() as upstream:
        proxy = await proxies.start(upstream=upstream.base_url)
        with pytest.raises(anthropic.APIStatusError) as raised:
            await create(proxy, extra_headers={"Content-Encoding": "br"})  # the SDK's plain JSON, called br
    assert raised.value.status_code == 400
    assert anthropic_error(raised.value)["type"] == "invalid_request_error"


async def test_a_stalled_body_is_an_invalid_request_error(proxies: LoopbackProxies) -> None:
    proxy = await proxies.start(upstream=f"http://127.0.0.1:{closed_port()}", client_body_timeout=0.3)
    head = (
        "POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nanthropic-version: 2023-06-01\r\n"
        "Content-Length: 1000\r\n\r\n"
    )
    answer = await raw_exchange(proxy.server.port, head.encode(), b'{"model": "claude-sonnet-4-5", "messa')
    assert status_of(answer) == 408
    body = orjson.loads(body_of(answer))
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "arrived too slowly" in body["error"]["message"]


async def test_a_chat_request_keeps_openais_shape(proxies: LoopbackProxies) -> None:
    proxy = await proxies.start(upstream=f"http://127.0.0.1:{closed_port()}")
    url = f"http://127.0.0.1:{proxy.server.port}/v1"
    async with openai.AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0) as client:
        with pytest.raises(openai.InternalServerError) as raised:
            await client.chat.completions.create(model="gpt-4o-mini", messages=QUESTION)  # type: ignore[arg-type]
    body = raised.value.body
    assert isinstance(body, dict) and body["type"] == "upstream_error" and body["code"] == "upstream_unreachable"


async def test_another_endpoint_of_the_api_passed_through_gets_its_shape(proxies: LoopbackProxies) -> None:
    # count_tokens is not compacted but forwarded as it came: the SDK's `anthropic-version` header tells its API.
    proxy = await proxies.start(upstream=f"http://127.0.0.1:{closed_port()}")
    async with sdk(proxy) as client:
        with pytest.raises(anthropic.InternalServerError) as raised:
            await client.messages.count_tokens(model=NON_BINDING, messages=QUESTION)  # type: ignore[arg-type]
    assert raised.value.status_code == 502
    assert anthropic_error(raised.value)["type"] == "api_error"
    url = f"http://127.0.0.1:{proxy.server.port}/v1"
    async with openai.AsyncOpenAI(base_url=url, api_key="sk-test", max_retries=0) as openai_client:
        with pytest.raises(openai.InternalServerError) as openai_raised:
            await openai_client.models.list()
    body = openai_raised.value.body
    assert isinstance(body, dict) and body["code"] == "upstream_unreachable", body
