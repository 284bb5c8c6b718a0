"""The fake OpenAI upstream behaves like OpenAI's API, as seen by the official SDK and by plain HTTP."""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import itertools
import json
import struct
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from proxy.simulator.openai_tokens import (
    PromptCache,
    count_message_tokens,
    count_prompt_tokens,
    count_text,
    encoding_name_for_model,
    image_tokens,
    tools_json,
)
from proxy.simulator.openai_upstream import (
    OpenAIUpstream,
    Reply,
    ToolCall,
    deterministic_bytes,
    fixed_responder,
    tool_loop_responder,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
USER_HELLO: list[Any] = [{"role": "user", "content": "hello"}]


@pytest.fixture
async def openai_upstream() -> AsyncIterator[OpenAIUpstream]:
    async with OpenAIUpstream(context_window=4096) as upstream:
        yield upstream


@pytest.fixture
async def client(openai_upstream: OpenAIUpstream) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=openai_upstream.base_url + "/v1", api_key="sk-test", max_retries=0) as sdk:
        yield sdk


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


def png_data_url(width: int, height: int) -> str:
    """A data URL whose bytes start like a PNG of the given size (all the counter reads)."""
    header = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + struct.pack(">II", width, height) + b"\x08\x02"
    return "data:image/png;base64," + base64.b64encode(header).decode()


def tool_results(message: Any) -> list[dict[str, Any]]:
    return [{"role": "tool", "tool_call_id": call.id, "content": f"result of {call.id}"} for call in message.tool_calls]


async def post_chat(http: aiohttp.ClientSession, upstream: OpenAIUpstream, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(f"{upstream.base_url}/v1/chat/completions", data=data) as response:
        return response.status, await response.json()


# ---- chat completions through the SDK -------------------------------------------------------------------------------


async def test_async_client_gets_an_openai_shaped_completion(
    client: AsyncOpenAI, openai_upstream: OpenAIUpstream
) -> None:
    raw = await client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=USER_HELLO)
    completion = raw.parse()
    body = json.loads(raw.content)

    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == "gpt-4o-mini"
    assert completion.choices[0].message.content == "ok 1 messages"
    assert completion.choices[0].finish_reason == "stop"
    message = body["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "ok 1 messages", "refusal": None, "annotations": []}
    # 3 per message + "user" + "hello" + 3 priming.
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == 3 + count_text("user") + count_text("hello") + 3
    assert completion.usage.completion_tokens == count_text("ok 1 messages")
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0, "audio_tokens": 0}
    assert set(body["usage"]["completion_tokens_details"]) >= {"reasoning_tokens", "audio_tokens"}
    assert raw.headers["x-request-id"].startswith("req_")


async def test_sync_client_plain_and_streaming(openai_upstream: OpenAIUpstream) -> None:
    def use_sync_client() -> tuple[str | None, str]:
        with OpenAI(base_url=openai_upstream.base_url + "/v1", api_key="sk-test", max_retries=0) as sdk:
            plain = sdk.chat.completions.create(model="gpt-4o", messages=USER_HELLO)
            stream = sdk.chat.completions.create(model="gpt-4o", messages=USER_HELLO, stream=True)
            streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
            return plain.choices[0].message.content, streamed

    plain, streamed = await asyncio.to_thread(use_sync_client)
    assert plain == streamed == "ok 1 messages"


async def test_stream_with_usage_ends_with_a_usage_chunk(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="gpt-4o",
        messages=USER_HELLO,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]

    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert len({chunk.id for chunk in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks[1:] if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1
    assert "".join(pieces) == "ok 1 messages"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == count_text("ok 1 messages")
    assert all(chunk.usage is None for chunk in chunks[:-1])


async def test_sse_framing_is_openais(http: aiohttp.ClientSession, openai_upstream: OpenAIUpstream) -> None:
    async def events(include_usage: bool) -> list[str]:
        body: dict[str, Any] = {"model": "gpt-4o", "messages": USER_HELLO, "stream": True}
        if include_usage:
            body["stream_options"] = {"include_usage": True}
        async with http.post(f"{openai_upstream.base_url}/v1/chat/completions", json=body) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            text = (await response.read()).decode()
        assert text.endswith("data: [DONE]\n\n")
        frames = text.split("\n\n")
        assert frames[-1] == ""
        assert all(frame.startswith("data: ") for frame in frames[:-1])
        return [frame.removeprefix("data: ") for frame in frames[:-2]]

    with_usage = [json.loads(e) for e in await events(include_usage=True)]
    assert all("usage" in chunk for chunk in with_usage)
    assert all(chunk["usage"] is None for chunk in with_usage[:-1])
    assert with_usage[-1]["choices"] == []
    without_usage = [json.loads(e) for e in await events(include_usage=False)]
    assert all("usage" not in chunk for chunk in without_usage)
    assert without_usage[-1]["choices"][0]["finish_reason"] == "stop"


async def test_stream_chunks_are_written_separately(http: aiohttp.ClientSession) -> None:
    async with OpenAIUpstream(responder=fixed_responder("one two three four five"), stream_chunk_delay=0.01) as up:
        body = {"model": "gpt-4o", "messages": USER_HELLO, "stream": True}
        async with http.post(f"{up.base_url}/v1/chat/completions", json=body) as response:
            reads = [piece async for piece in response.content.iter_any()]
    assert len(reads) > 3


async def test_max_completion_tokens_truncates_with_finish_reason_length(openai_upstream: OpenAIUpstream) -> None:
    openai_upstream.responder = fixed_responder("one two three four five six seven eight")
    async with AsyncOpenAI(base_url=openai_upstream.base_url + "/v1", api_key="sk-test", max_retries=0) as sdk:
        completion = await sdk.chat.completions.create(
            model="gpt-4o",
            messages=USER_HELLO,
            max_completion_tokens=3,
        )
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content == "one two three"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 3


# ---- tool calls ------------------------------------------------------------------------------------------------------


async def test_tool_loop_makes_parallel_calls_then_answers(
    client: AsyncOpenAI, openai_upstream: OpenAIUpstream
) -> None:
    openai_upstream.responder = tool_loop_responder("search", steps=2, parallel=3)
    messages: list[Any] = [{"role": "user", "content": "find it"}]
    seen_ids: list[str] = []
    for _ in range(2):
        completion = await client.chat.completions.create(model="gpt-4o", messages=messages)
        message = completion.choices[0].message
        assert completion.choices[0].finish_reason == "tool_calls"
        assert message.content is None
        assert message.tool_calls is not None
        assert [call.model_dump()["function"]["name"] for call in message.tool_calls] == ["search"] * 3
        seen_ids += [call.id for call in message.tool_calls]
        messages += [message.model_dump(exclude_none=True), *tool_results(message)]

    final = await client.chat.completions.create(model="gpt-4o", messages=messages)
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == "done: 6 tool calls"
    assert len(set(seen_ids)) == 6
    assert all(call_id.startswith("call_") and len(call_id) == 29 for call_id in seen_ids)
    replay = await client.chat.completions.create(model="gpt-4o", messages=messages[:1])
    assert [call.id for call in replay.choices[0].message.tool_calls or []] == seen_ids[:3]


async def test_streamed_tool_calls_reassemble(client: AsyncOpenAI, openai_upstream: OpenAIUpstream) -> None:
    arguments = {"query": "a rather long query string, so it streams in fragments", "limit": 10}
    openai_upstream.responder = tool_loop_responder("search", steps=1, parallel=2, arguments=lambda s, k: arguments)
    stream = await client.chat.completions.create(model="gpt-4o", messages=USER_HELLO, stream=True)
    calls: dict[int, dict[str, str]] = {}
    fragments = 0
    finish_reason = None
    async for chunk in stream:
        choice = chunk.choices[0]
        finish_reason = choice.finish_reason or finish_reason
        for delta in choice.delta.tool_calls or ():
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += delta.id or ""
            assert delta.function is not None
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
            fragments += 1
    assert finish_reason == "tool_calls"
    assert sorted(calls) == [0, 1]
    assert all(json.loads(call["arguments"]) == arguments and call["name"] == "search" for call in calls.values())
    assert fragments > 6


async def test_long_tool_run_keeps_hitting_the_prompt_cache(
    client: AsyncOpenAI, openai_upstream: OpenAIUpstream
) -> None:
    openai_upstream.context_window = 200_000
    openai_upstream.responder = tool_loop_responder("read_file", steps=40)
    messages: list[Any] = [{"role": "system", "content": "You are an agent. " * 200}, {"role": "user", "content": "go"}]
    for _ in range(40):
        completion = await client.chat.completions.create(model="gpt-4o", messages=messages)
        message = completion.choices[0].message
        messages += [message.model_dump(exclude_none=True), *tool_results(message)]
    final = await client.chat.completions.create(model="gpt-4o", messages=messages)

    assert final.choices[0].message.content == "done: 40 tool calls"
    prompts = [usage["prompt_tokens"] for usage in openai_upstream.usages]
    cached = [usage["prompt_tokens_details"]["cached_tokens"] for usage in openai_upstream.usages]
    assert prompts == sorted(prompts)
    assert all(c % 128 == 0 and (c == 0 or c >= 1024) for c in cached)
    assert all(now >= before for before, now in itertools.pairwise(cached))
    # From the third request on, everything the previous prompt sent but its 3 priming tokens is a cache hit
    # (up to the 128-token rounding): the conversation only grows at its end.
    assert all(cached[i] > prompts[i - 1] - 3 - 128 for i in range(2, len(prompts)))


async def test_orphan_tool_result_is_rejected(client: AsyncOpenAI) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "call_1", "content": "orphan"},
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="gpt-4o", messages=messages)
    assert caught.value.status_code == 400
    assert caught.value.param == "messages.[1].role"
    assert "must be a response to a preceeding message with 'tool_calls'" in caught.value.message


async def test_unanswered_and_mismatched_tool_calls_are_rejected(
    http: aiohttp.ClientSession, openai_upstream: OpenAIUpstream
) -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    assistant = {"role": "assistant", "content": None, "tool_calls": [{"id": "a", **call}, {"id": "b", **call}]}
    unanswered = [{"role": "user", "content": "hi"}, assistant, {"role": "tool", "tool_call_id": "a", "content": "x"}]
    status, body = await post_chat(http, openai_upstream, {"model": "gpt-4o", "messages": unanswered})
    assert status == 400
    assert body["error"]["message"] == (
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
        "'tool_call_id'. The following tool_call_ids did not have response messages: b"
    )
    assert body["error"]["param"] == "messages.[1].role"

    mismatched = [*unanswered, {"role": "tool", "tool_call_id": "zzz", "content": "x"}]
    status, body = await post_chat(http, openai_upstream, {"model": "gpt-4o", "messages": mismatched})
    assert status == 400
    assert body["error"]["param"] == "messages.[3].tool_call_id"


# ---- context window --------------------------------------------------------------------------------------------------


async def test_context_overflow_is_openais_error(client: AsyncOpenAI, openai_upstream: OpenAIUpstream) -> None:
    messages: list[Any] = [{"role": "user", "content": "word " * 5000}]
    expected = count_prompt_tokens({"model": "gpt-4o", "messages": messages})
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="gpt-4o", messages=messages)
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.body == {
        "message": (
            f"This model's maximum context length is 4096 tokens. However, your messages resulted in {expected} "
            "tokens. Please reduce the length of the messages."
        ),
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
    assert [r.path for r in openai_upstream.requests] == ["/v1/chat/completions"]


async def test_completion_budget_and_per_model_windows_count(
    client: AsyncOpenAI, openai_upstream: OpenAIUpstream
) -> None:
    openai_upstream.context_windows = {"gpt-4o": 100, "gpt-4o-mini-2024": 50}
    assert openai_upstream.window_for("gpt-4o-2024-08-06") == 100
    assert openai_upstream.window_for("gpt-4o-mini-2024-07-18") == 50
    assert openai_upstream.window_for("o3") == 4096
    prompt = count_prompt_tokens({"model": "gpt-4o", "messages": USER_HELLO})

    await client.chat.completions.create(model="gpt-4o", messages=USER_HELLO, max_tokens=100 - prompt)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model="gpt-4o", messages=USER_HELLO, max_tokens=101 - prompt)
    assert caught.value.code == "context_length_exceeded"
    assert f"However, you requested 101 tokens ({prompt} in the messages" in caught.value.message


# ---- malformed requests ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (b"{not json", None, None),
        ({"model": "gpt-4o"}, "messages", "missing_required_parameter"),
        ({"model": "gpt-4o", "messages": []}, "messages", "empty_array"),
        ({"model": "gpt-4o", "messages": "hello"}, "messages", "invalid_type"),
        ({"model": "gpt-4o", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "invalid_value"),
        ({"model": "gpt-4o", "messages": [{"content": "x"}]}, "messages[0].role", "missing_required_parameter"),
        ({"messages": USER_HELLO}, None, None),
        ({"model": "gpt-4o", "messages": USER_HELLO, "max_tokens": {"n": 1}}, "max_tokens", "invalid_type"),
        (
            {"model": "gpt-4o", "messages": USER_HELLO, "stream_options": {"include_usage": True}},
            "stream_options",
            None,
        ),
    ],
)
async def test_malformed_requests_get_openai_error_bodies(
    http: aiohttp.ClientSession, openai_upstream: OpenAIUpstream, body: Any, param: str | None, code: str | None
) -> None:
    status, answer = await post_chat(http, openai_upstream, body)
    assert status == 400
    assert set(answer) == {"error"}
    assert set(answer["error"]) == {"message", "type", "param", "code"}
    assert answer["error"]["type"] == "invalid_request_error"
    assert (answer["error"]["param"], answer["error"]["code"]) == (param, code)


async def test_unknown_route_is_a_json_404(http: aiohttp.ClientSession, openai_upstream: OpenAIUpstream) -> None:
    async with http.get(f"{openai_upstream.base_url}/v1/chat/completions") as response:
        assert response.status == 404
        assert (await response.json())["error"]["message"] == "Invalid URL (GET /v1/chat/completions)"


# ---- token counting --------------------------------------------------------------------------------------------------


def test_counting_follows_the_cookbook_formula() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "x"}'}}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief", "name": "boss"},
        {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "text", "text": " here"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "found"},
    ]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]

    def n(text: str) -> int:
        return count_text(text)

    expected_messages = (
        (3 + n("system") + n("be brief") + n("boss") + 1)
        + (3 + n("user") + n("look") + n(" here"))
        + (3 + n("assistant") + n("lookup") + n('{"q": "x"}'))
        + (3 + n("tool") + n("call_1") + n("found"))
    )
    assert sum(count_message_tokens(m) for m in messages) == expected_messages
    request = {"model": "gpt-4o", "messages": messages, "tools": tools}
    assert count_prompt_tokens(request) == n(tools_json(tools)) + expected_messages + 3


def test_images_count_as_openai_bills_them() -> None:
    assert image_tokens("https://example.com/cat.png", "high") == 85
    assert image_tokens(png_data_url(1024, 1024), "low") == 85
    assert image_tokens(png_data_url(1024, 1024), "high") == 765
    assert image_tokens(png_data_url(2048, 4096), "auto") == 1105
    message = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": png_data_url(1024, 1024)}}]}
    assert count_message_tokens(message) == 3 + count_text("user") + 765


def test_encoding_follows_the_model_family() -> None:
    assert encoding_name_for_model("gpt-4") == "cl100k_base"
    assert encoding_name_for_model("gpt-4-turbo") == "cl100k_base"
    assert encoding_name_for_model("gpt-3.5-turbo") == "cl100k_base"
    assert encoding_name_for_model("gpt-4o-mini") == "o200k_base"
    assert encoding_name_for_model("gpt-4.1") == "o200k_base"
    assert encoding_name_for_model("o3-mini") == "o200k_base"


def test_prompt_cache_rounds_to_128_from_1024() -> None:
    cache = PromptCache()
    base = list(range(3000))
    assert cache.cached_tokens("m", base) == 0
    assert cache.cached_tokens("m", base[:1000] + [-9] * 2000) == 0
    assert cache.cached_tokens("m", [*base[:2000], -9]) == 1920
    assert cache.cached_tokens("m", base) == 2944
    assert cache.cached_tokens("other-model", base) == 0


async def test_repeated_prompt_reports_cached_tokens(client: AsyncOpenAI, openai_upstream: OpenAIUpstream) -> None:
    messages: list[Any] = [{"role": "user", "content": "lorem ipsum " * 700}]
    first = await client.chat.completions.create(model="gpt-4o", messages=messages)
    second = await client.chat.completions.create(model="gpt-4o", messages=messages)
    assert first.usage is not None
    assert second.usage is not None
    assert first.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens // 128 * 128


# ---- models, embeddings, Azure ---------------------------------------------------------------------------------------


async def test_models_list_and_retrieve(client: AsyncOpenAI) -> None:
    models = [model.id async for model in client.models.list()]
    assert "gpt-4o-mini" in models
    assert (await client.models.retrieve("gpt-4o-mini")).object == "model"
    with pytest.raises(openai.NotFoundError) as caught:
        await client.models.retrieve("no-such-model")
    assert caught.value.code == "model_not_found"


async def test_embeddings_are_deterministic_unit_vectors(client: AsyncOpenAI) -> None:
    first = await client.embeddings.create(model="text-embedding-3-small", input=["alpha", "beta"])
    again = await client.embeddings.create(model="text-embedding-3-small", input="alpha", encoding_format="float")
    small = await client.embeddings.create(model="text-embedding-3-small", input="alpha", dimensions=8)

    assert [item.index for item in first.data] == [0, 1]
    assert len(first.data[0].embedding) == 1536
    assert first.data[0].embedding != first.data[1].embedding
    assert again.data[0].embedding == pytest.approx(first.data[0].embedding, abs=1e-6)
    assert sum(v * v for v in small.data[0].embedding) == pytest.approx(1.0, abs=1e-5)
    assert first.usage.prompt_tokens == 2


async def test_azure_deployment_path(http: aiohttp.ClientSession, openai_upstream: OpenAIUpstream) -> None:
    url = f"{openai_upstream.base_url}/openai/deployments/my-gpt4o/chat/completions?api-version=2024-10-21"
    async with http.post(url, json={"messages": USER_HELLO}, headers={"api-key": "azure-key"}) as response:
        assert response.status == 200
        assert (await response.json())["model"] == "my-gpt4o"
    assert openai_upstream.requests[-1].query["api-version"] == "2024-10-21"


# ---- recording -------------------------------------------------------------------------------------------------------


async def test_every_request_is_recorded_byte_for_byte(client: AsyncOpenAI, openai_upstream: OpenAIUpstream) -> None:
    await client.chat.completions.create(model="gpt-4o", messages=USER_HELLO, extra_headers={"X-Conversation-Id": "c1"})
    await client.models.list()

    chat, models = openai_upstream.requests
    assert (chat.method, chat.path) == ("POST", "/v1/chat/completions")
    assert chat.headers["Authorization"] == "Bearer sk-test"
    assert chat.headers["x-conversation-id"] == "c1"
    assert json.loads(chat.body) == chat.json == {"model": "gpt-4o", "messages": USER_HELLO}
    assert openai_upstream.chat_requests == [chat.json]
    assert (models.method, models.path, models.body, models.json) == ("GET", "/v1/models", b"", None)


# ---- echo ------------------------------------------------------------------------------------------------------------


async def test_echo_describes_the_request(http: aiohttp.ClientSession, openai_upstream: OpenAIUpstream) -> None:
    body = b"\x00binary\xffbody"
    url = f"{openai_upstream.base_url}/echo/a%2Fb/c?x=1&x=2&y="
    async with http.put(url, data=body, headers={"X-Custom": "v"}) as response:
        described = await response.json()
    assert described["method"] == "PUT"
    assert described["raw_path"] == "/echo/a%2Fb/c"
    assert described["query_string"] == "x=1&x=2&y="
    assert ["X-Custom", "v"] in described["headers"]
    assert described["body_sha256"] == hashlib.sha256(body).hexdigest()
    assert described["body_length"] == len(body)


async def test_echo_gzip_and_large_bodies(http: aiohttp.ClientSession, openai_upstream: OpenAIUpstream) -> None:
    base = f"{openai_upstream.base_url}/echo/blob"
    async with http.get(f"{base}?size=300000&gzip=1", auto_decompress=False) as response:
        raw = await response.read()
        assert response.headers["Content-Encoding"] == "gzip"
        assert response.headers["X-Body-Sha256"] == hashlib.sha256(raw).hexdigest()
    assert gzip.decompress(raw) == deterministic_bytes(300_000)

    async with http.get(f"{base}?size=1000000&chunked=1&status=203") as response:
        assert response.status == 203
        assert "Content-Length" not in response.headers
        assert await response.read() == deterministic_bytes(1_000_000)

    async with http.get(f"{base}?gzip=1") as response:
        assert (await response.json())["path"] == "/echo/blob"


# ---- fault injection -------------------------------------------------------------------------------------------------


async def test_scripted_rate_limit_then_recovery(client: AsyncOpenAI, openai_upstream: OpenAIUpstream) -> None:
    openai_upstream.fail_next(429, headers={"retry-after": "2", "x-ratelimit-remaining-requests": "0"})
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model="gpt-4o", messages=USER_HELLO)
    assert caught.value.code == "rate_limit_exceeded"
    assert caught.value.response.headers["retry-after"] == "2"
    assert caught.value.response.headers["x-ratelimit-remaining-requests"] == "0"

    completion = await client.chat.completions.create(model="gpt-4o", messages=USER_HELLO)
    assert completion.choices[0].message.content == "ok 1 messages"
    assert len(openai_upstream.requests) == 2


async def test_misreported_usage_is_reported_once(client: AsyncOpenAI, openai_upstream: OpenAIUpstream) -> None:
    openai_upstream.misreport_usage_next(prompt_tokens=10**15, total_tokens=10**15 + 3)
    misreported = await client.chat.completions.create(model="gpt-4o", messages=USER_HELLO)
    assert misreported.usage is not None
    assert (misreported.usage.prompt_tokens, misreported.usage.total_tokens) == (10**15, 10**15 + 3)
    assert misreported.choices[0].message.content == "ok 1 messages"
    honest = await client.chat.completions.create(model="gpt-4o", messages=USER_HELLO)
    assert honest.usage is not None and honest.usage.prompt_tokens < 100
    assert [usage["prompt_tokens"] for usage in openai_upstream.usages] == [10**15, honest.usage.prompt_tokens]


async def test_custom_failure_body_and_connection_reset(
    http: aiohttp.ClientSession, openai_upstream: OpenAIUpstream
) -> None:
    openai_upstream.fail_next(503, body="upstream down", times=2)
    openai_upstream.fail_next(reset=True)
    for _ in range(2):
        async with http.get(f"{openai_upstream.base_url}/v1/models") as response:
            assert (response.status, await response.text()) == (503, "upstream down")
    with pytest.raises(aiohttp.ServerDisconnectedError):
        async with http.post(f"{openai_upstream.base_url}/v1/models") as response:
            await response.read()
    async with http.get(f"{openai_upstream.base_url}/v1/models") as response:
        assert response.status == 200


async def test_stream_is_cut_after_n_chunks(http: aiohttp.ClientSession, openai_upstream: OpenAIUpstream) -> None:
    openai_upstream.fail_next(cut_after_chunks=2)
    body = {"model": "gpt-4o", "messages": USER_HELLO, "stream": True}
    received = b""
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post(f"{openai_upstream.base_url}/v1/chat/completions", json=body) as response:
            assert response.status == 200
            async for piece in response.content.iter_any():
                received += piece
    assert received.count(b"data: ") == 2
    assert b"[DONE]" not in received


async def test_cut_stream_surfaces_in_the_sdk(client: AsyncOpenAI, openai_upstream: OpenAIUpstream) -> None:
    openai_upstream.cut_stream_after = 3
    stream = await client.chat.completions.create(model="gpt-4o", messages=USER_HELLO, stream=True)
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass


async def test_delay_first_byte(http: aiohttp.ClientSession, openai_upstream: OpenAIUpstream) -> None:
    openai_upstream.delay_first_byte = 0.2
    started = time.monotonic()
    async with http.get(f"{openai_upstream.base_url}/v1/models") as response:
        assert response.status == 200
    assert time.monotonic() - started >= 0.2


# ---- responders ------------------------------------------------------------------------------------------------------


async def test_custom_responder_sees_the_request(client: AsyncOpenAI, openai_upstream: OpenAIUpstream) -> None:
    def respond(request: dict[str, Any]) -> Reply:
        return Reply(content=f"model={request['model']}", tool_calls=(ToolCall(id="call_x", name="f"),))

    openai_upstream.responder = respond
    completion = await client.chat.completions.create(model="gpt-4.1", messages=USER_HELLO)
    assert completion.choices[0].message.content == "model=gpt-4.1"
    assert completion.choices[0].finish_reason == "tool_calls"


# ---- as a separate process -------------------------------------------------------------------------------------------


async def test_runs_as_a_process(http: aiohttp.ClientSession) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.support.upstream_process",
        "--port",
        "0",
        "--context-window",
        "2048",
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        base_url = (await asyncio.wait_for(process.stdout.readline(), timeout=20)).decode().strip()
        assert base_url.startswith("http://127.0.0.1:")
        async with http.get(f"{base_url}/v1/models") as response:
            assert response.status == 200
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), timeout=10) == 0


async def test_clear_forgets_what_was_recorded(http: aiohttp.ClientSession, openai_upstream: OpenAIUpstream) -> None:
    await post_chat(http, openai_upstream, {"model": "gpt-4o", "messages": USER_HELLO})
    openai_upstream.fail_next(500)
    openai_upstream.clear()
    async with http.get(f"{openai_upstream.base_url}/v1/models") as response:
        assert response.status == 200
    assert [r.path for r in openai_upstream.requests] == ["/v1/models"]
    assert openai_upstream.usages == []


async def test_client_leaving_mid_stream_is_quiet(
    http: aiohttp.ClientSession, openai_upstream: OpenAIUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    openai_upstream.responder = fixed_responder("word " * 2000)
    openai_upstream.stream_chunk_delay = 0.001
    body = {"model": "gpt-4o", "messages": USER_HELLO, "stream": True}
    async with http.post(f"{openai_upstream.base_url}/v1/chat/completions", json=body) as response:
        await response.content.readuntil(b"\n\n")
        response.close()
    await openai_upstream.close()  # waits for the streaming handler to notice and finish
    assert not [record for record in caplog.records if record.levelname == "ERROR"]
