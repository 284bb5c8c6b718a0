"""A small request whose bytes are under the trigger is forwarded as it came, and decided by its size alone.

`proxy.pipeline.byte_bound`: the proxy parses such a request but hashes, counts and remembers nothing of it. What the
client sees says so (`X-Compaction-Tokens-Before` is the body's length, marked as a bound); what the upstream sees is
the client's body byte for byte, streamed or not; media are never sized by their bytes; and the request keeps what
the proxy owes every request: a retry after an overflow, and the window it learns from the usage report.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from proxy.server.upstream import PIECES_FROM_BYTES
from proxy.simulator.openai_upstream import OpenAIUpstream, context_length_error
from tests.e2e.conftest import MODEL, StartProxy
from tests.support.chat_requests import history, post

BIG_WINDOW = {MODEL: 1_000_000}


@pytest.fixture
async def base_url(upstream: OpenAIUpstream, start_proxy: StartProxy) -> str:
    """A proxy that takes the model's window to be a million tokens, before an upstream that has as many."""
    upstream.context_window = 1_000_000
    return await start_proxy(context_windows=BIG_WINDOW)


async def test_a_request_under_the_trigger_in_bytes_is_forwarded_as_it_came(
    upstream: OpenAIUpstream, base_url: str
) -> None:
    body = history(4)
    status, headers, _ = await post(base_url, body)
    assert status == 200
    assert upstream.requests[-1].body == body
    assert headers["X-Compaction"] == "unchanged"
    assert headers["X-Compaction-Tokens-Before"] == str(len(body))
    assert headers["X-Compaction-Tokens-Before-Bound"] == "true"
    assert int(headers["X-Compaction-Tokens-Before"]) >= upstream.usages[-1]["prompt_tokens"]


async def test_a_streamed_request_under_the_trigger_is_relayed_without_asking_for_usage(
    upstream: OpenAIUpstream, base_url: str
) -> None:
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-alice", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hi"}], stream=True
        )
        chunks = [chunk async for chunk in stream]
    assert "stream_options" not in upstream.requests[-1].json
    assert chunks and all(chunk.usage is None for chunk in chunks)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)


async def test_an_image_is_never_sized_by_its_bytes(base_url: str) -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/chart.png"}}
    message: dict[str, Any] = {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}
    body = json.dumps({"model": MODEL, "messages": [message]}).encode()
    status, headers, _ = await post(base_url, body)
    assert status == 200
    # Sized the full way: the image counts as OpenAI charges a high-detail image of unknown size, far above its bytes.
    assert int(headers["X-Compaction-Tokens-Before"]) > len(body)


async def test_an_overflow_of_a_request_sized_by_its_bytes_is_retried(upstream: OpenAIUpstream, base_url: str) -> None:
    # The proxy believes the window is a million tokens; the upstream has 1,024 and says so in its error.
    upstream.context_window = 1_024
    status, headers, reply = await post(base_url, history(6))
    assert status == 200, reply
    assert headers["X-Compaction"] == "compacted-after-overflow"
    assert headers["X-Compaction-Context-Window"] == "1024"


async def test_the_usage_report_of_a_request_sized_by_its_bytes_still_shows_what_fits(
    upstream: OpenAIUpstream, base_url: str
) -> None:
    status, headers, _ = await post(base_url, history(6))
    assert status == 200 and headers["X-Compaction-Tokens-Before-Bound"] == "true"
    assert upstream.usages[-1]["prompt_tokens"] > 100
    # An answer claiming a window below what just fitted is not learned (no retry): the next request is left as it is.
    upstream.fail_next(400, context_length_error(100, 300, 0).body)
    status, _, _ = await post(base_url, history(6))
    assert status == 400
    status, headers, _ = await post(base_url, history(6))
    assert status == 200 and headers["X-Compaction"] == "unchanged"


async def test_a_large_body_reaches_the_upstream_whole_with_its_length(upstream: OpenAIUpstream, base_url: str) -> None:
    # From PIECES_FROM_BYTES the proxy hands the body to its client in pieces: still one body of a stated length.
    body = history(60)
    assert len(body) >= PIECES_FROM_BYTES
    status, _, _ = await post(base_url, body)
    assert status == 200
    received = upstream.requests[-1]
    assert received.body == body
    assert received.headers["Content-Length"] == str(len(body))
    assert "Transfer-Encoding" not in received.headers
