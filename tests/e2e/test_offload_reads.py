"""Offloaded tool results read back through the proxy, end to end, for every format; then what only chat completions
and the Responses API are checked for (read rounds, tenants, the next turn's prefix), with the `openai` SDK.

The conversation's older large tool result is offloaded when it is compacted; the fake model (`reading_model`) calls
the proxy's read tool with the reference it sees; the proxy answers the call itself and asks again; the client
receives only the final answer, which quotes the secret marker it found in the text it read back.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import openai
import orjson
import pytest

from proxy.engine.strategies.offload import content_reference
from proxy.pipeline.offload.reads import NOT_HELD, REPEATED, TOO_LARGE
from proxy.pipeline.offload.tool import READ_TOOL
from tests.e2e.conftest import MODEL, StartProxy
from tests.support.openai_upstream import OpenAIUpstream, Reply, ToolCall
from tests.support.proxies import LoopbackProxies
from tests.support.reading_model import PLAIN_ANSWER, reading_chat_responder, reading_responses_responder
from tests.support.responses_api import FunctionCall, ResponsesReply
from tests.support.wire_formats import CHAT_COMPLETIONS, FormatCase, Upstream, by_format

SECRET = "SECRET-7731"
LOG = "".join(f"step {i:03d}: compiled module m{i} in {i * 7 % 97} ms\n" for i in range(230)) + f"{SECRET} failed.\n"
CLIENT_TOOLS: list[Any] = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
    for name in ("fetch_log", "check_status")
]
READ_WINDOW = 4400
"""The window (the proxy's and the upstream's) where `LOG` is offloaded and fits again when read, in every format."""


def held_log(wire: FormatCase) -> dict[str, Any]:
    """`conversation`, in the format of `wire`."""
    return wire.tool_conversation(
        "Investigate the failed build.",
        [("fetch_log", LOG), ("check_status", "status: red")],
        "Which marker does the log end with?",
    )


def mentions(value: Any, text: str) -> bool:
    """Whether `text` is in `value` (a JSON value, its strings escaped as JSON escapes them)."""
    return orjson.dumps(text).decode()[1:-1] in orjson.dumps(value).decode()


@by_format()
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_an_offloaded_result_is_read_back_by_the_proxy(
    wire: FormatCase, format_upstream: Upstream, format_proxies: LoopbackProxies, stream: bool
) -> None:
    wire.use_reading_model(format_upstream)
    format_upstream.context_window = READ_WINDOW
    proxy = await format_proxies.start(context_windows={wire.model: READ_WINDOW})
    body = held_log(wire)
    status, headers, answer = await wire.post(proxy, wire.streamed(body) if stream else body)
    assert status == 200, answer
    got = wire.read(answer)
    assert (got.text, got.calls, got.parts) == (f"found {SECRET}", [], [wire.text_part])
    assert READ_TOOL not in (answer.decode() if isinstance(answer, bytes) else orjson.dumps(answer).decode())
    # A stream's headers went out before its reads were answered.
    assert headers.get("X-Compaction-Reads") == (None if stream else "1")
    assert headers["X-Compaction-Offloaded"] == "1"
    assert "tool_result_offloading" in headers["X-Compaction-Strategies"]
    first, second = wire.forwarded(format_upstream)
    assert [sent["accept-encoding"] for sent in wire.forwarded_headers(format_upstream)] == ["identity", "identity"]
    assert wire.tool_names(first) == ["fetch_log", "check_status", READ_TOOL]
    held = next(index for index, entry in enumerate(body[wire.entries]) if mentions(entry, LOG))
    assert not mentions(orjson.loads(first), LOG) and mentions(wire.entries_of(first)[held], content_reference(LOG))
    assert wire.entries_of(second)[: len(wire.entries_of(first))] == wire.entries_of(first)
    assert wire.entries_of(second)[-1] == wire.read_result(LOG)
    assert got.prompt_tokens == sum(wire.upstream_prompt_tokens(format_upstream))
    if wire is CHAT_COMPLETIONS and not stream:
        assert isinstance(answer, dict) and isinstance(format_upstream, OpenAIUpstream)
        assert answer["usage"]["total_tokens"] == sum(usage["total_tokens"] for usage in format_upstream.usages)
    exposed = await proxy.exposition()
    assert 'compaction_proxy_offload_reads_total{result="served"} 1.0' in exposed
    assert "compaction_proxy_offloaded_results_total 1.0" in exposed
    bytes_held = re.search(r"^compaction_proxy_offload_bytes_held (\S+)$", exposed, re.MULTILINE)
    assert bytes_held is not None and float(bytes_held.group(1)) >= len(LOG)


# ---- chat completions and the Responses API, with the `openai` SDK ---------------------------------------------


def conversation(log: str = LOG, question: str = "Which marker does the log end with?") -> list[dict[str, Any]]:
    """A tool-calling conversation whose first (older) result is large: the one compaction offloads."""
    return [
        {"role": "system", "content": "You are a build assistant."},
        {"role": "user", "content": "Investigate the failed build."},
        {"role": "assistant", "content": None, "tool_calls": [_call("call_1", "fetch_log")]},
        {"role": "tool", "tool_call_id": "call_1", "content": log},
        {"role": "assistant", "content": None, "tool_calls": [_call("call_2", "check_status")]},
        {"role": "tool", "tool_call_id": "call_2", "content": "status: red"},
        {"role": "user", "content": question},
    ]


def _call(call_id: str, name: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


@pytest.fixture
async def client(upstream: OpenAIUpstream, start_proxy: StartProxy) -> AsyncIterator[openai.AsyncOpenAI]:
    upstream.responder = reading_chat_responder
    upstream.responses_responder = reading_responses_responder
    async with openai.AsyncOpenAI(base_url=await start_proxy(), api_key="sk-alice", max_retries=0) as sdk:
        yield sdk


def chat_bodies(upstream: OpenAIUpstream) -> list[dict[str, Any]]:
    return [orjson.loads(request.body) for request in upstream.requests if request.path.endswith("/chat/completions")]


def tool_names(body: dict[str, Any]) -> list[str]:
    return [tool.get("name") or tool["function"]["name"] for tool in body.get("tools") or ()]


async def test_read_rounds_are_bounded(upstream: OpenAIUpstream, start_proxy: StartProxy) -> None:
    def insistent(request: dict[str, Any]) -> Reply:
        """Reads again after every read, until told to use no tools."""
        if request.get("tool_choice") == "none":
            return Reply(content="answered without reading more")
        reference = content_reference(LOG)
        return Reply(
            tool_calls=(ToolCall(f"read-{len(request['messages'])}", READ_TOOL, f'{{"reference": "{reference}"}}'),)
        )

    upstream.responder = insistent
    upstream.context_window = 16_384  # room for every read: the proxy still compacts for 4k
    async with openai.AsyncOpenAI(base_url=await start_proxy(offload_read_rounds=2), api_key="k", max_retries=0) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(
            model=MODEL, messages=conversation(), tools=CLIENT_TOOLS
        )
    assert raw.parse().choices[0].message.content == "answered without reading more"
    assert raw.headers["x-compaction-reads"] == "1"  # the same text is sent once: the second read is told so
    bodies = chat_bodies(upstream)
    assert [body.get("tool_choice") for body in bodies] == [None, None, "none"]
    assert [message["content"] for message in bodies[-1]["messages"][-3::2]] == [LOG, REPEATED]


async def test_a_read_that_does_not_fit_is_answered_without_it(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    upstream.responder = lambda request: (
        Reply(content="answered from the preview")
        if request.get("tool_choice") == "none"
        else Reply(tool_calls=(ToolCall("read-0", READ_TOOL, f'{{"reference": "{content_reference(LOG)}"}}'),))
    )
    upstream.context_window = 2_000  # what was offloaded does not fit again
    async with openai.AsyncOpenAI(base_url=await start_proxy(), api_key="k", max_retries=0) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(
            model=MODEL, messages=conversation(), tools=CLIENT_TOOLS
        )
    assert raw.parse().choices[0].message.content == "answered from the preview"
    assert raw.headers["x-compaction-reads"] == "0"
    first, refused, fallback = chat_bodies(upstream)
    assert fallback == {**first, "tool_choice": "none"}
    assert refused["messages"][-1]["content"] == LOG


async def test_a_streamed_read_never_reaches_the_client_nor_adds_a_usage_chunk(
    client: openai.AsyncOpenAI, upstream: OpenAIUpstream
) -> None:
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=conversation(), tools=CLIENT_TOOLS, stream=True
    )
    chunks = [chunk async for chunk in raw.parse()]
    assert "x-compaction-reads" not in raw.headers  # a stream's headers go out before the model decides to read
    deltas = [choice.delta for chunk in chunks for choice in chunk.choices]
    assert not any(delta.tool_calls for delta in deltas)
    assert "".join(delta.content or "" for delta in deltas) == f"found {SECRET}"
    assert [chunk.usage for chunk in chunks if chunk.usage is not None] == []
    assert len(chat_bodies(upstream)) == 2


@pytest.mark.parametrize("stream", [False, True])
async def test_the_prefix_stays_the_same_on_the_next_turn(
    client: openai.AsyncOpenAI, upstream: OpenAIUpstream, stream: bool
) -> None:
    history = conversation()
    turn = await client.chat.completions.create(model=MODEL, messages=history, tools=CLIENT_TOOLS)
    history += [{"role": "assistant", "content": turn.choices[0].message.content}, {"role": "user", "content": "Ok?"}]
    second = await client.chat.completions.create(model=MODEL, messages=history, tools=CLIENT_TOOLS, stream=stream)
    if stream:
        assert "".join([c.choices[0].delta.content or "" async for c in second if c.choices]) == f"found {SECRET}"
    bodies = chat_bodies(upstream)
    assert len(bodies) == 4
    before, after = bodies[0], bodies[2]
    sent = len(before["messages"])
    assert orjson.dumps(after["messages"][:sent]) == orjson.dumps(before["messages"])
    assert after["tools"] == before["tools"]
    assert after["messages"][sent:] == history[-2:]


async def test_tenant_b_cannot_read_tenant_a_results(
    client: openai.AsyncOpenAI, upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    await client.chat.completions.create(model=MODEL, messages=conversation(), tools=CLIENT_TOOLS)
    other = LOG.replace(SECRET, "SECRET-1002")
    guessed = "offloaded-" + "0" * 32
    question = f"Compare with {content_reference(LOG)} and {guessed}."
    async with openai.AsyncOpenAI(base_url=str(client.base_url), api_key="sk-bob", max_retries=0) as bob:
        raw = await bob.chat.completions.with_raw_response.create(
            model=MODEL, messages=conversation(other, question), tools=CLIENT_TOOLS
        )
    assert raw.parse().choices[0].message.content == "found SECRET-1002"
    assert raw.headers["x-compaction-reads"] == "1"  # the one read answered with a held text, not the "not held" two
    assert raw.headers["x-compaction-reads-not-held"] == "2"
    read = chat_bodies(upstream)[-1]["messages"][-3:]
    assert [message["content"] for message in read] == [other, NOT_HELD, NOT_HELD]
    assert not any(SECRET in orjson.dumps(body).decode() for body in chat_bodies(upstream)[2:])


@pytest.mark.parametrize("how", ["header", "setting"])
async def test_offload_off_leaves_plain_pruning(upstream: OpenAIUpstream, start_proxy: StartProxy, how: str) -> None:
    upstream.responder = reading_chat_responder
    base_url = await start_proxy(**({"offload": False} if how == "setting" else {}))
    headers = {"X-Compaction-Offload": "off"} if how == "header" else {}
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-alice", max_retries=0) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(
            model=MODEL, messages=conversation(), tools=CLIENT_TOOLS, extra_headers=headers
        )
    assert raw.parse().choices[0].message.content == PLAIN_ANSWER
    assert raw.headers["x-compaction-strategies"] == "tool_result_pruning"
    assert "x-compaction-reads" not in raw.headers
    (body,) = chat_bodies(upstream)
    assert tool_names(body) == ["fetch_log", "check_status"]


def response_items(log: str = LOG) -> list[dict[str, Any]]:
    """`conversation` as Responses API input items."""
    return [
        {"role": "user", "content": "Investigate the failed build."},
        {"type": "function_call", "call_id": "call_1", "name": "fetch_log", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": log},
        {"type": "function_call", "call_id": "call_2", "name": "check_status", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_2", "output": "status: red"},
        {"role": "user", "content": "Which marker does the log end with?"},
    ]


RESPONSES_TOOLS: list[Any] = [
    {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}}
    for name in ("fetch_log", "check_status")
]


def read_call_arguments() -> str:
    return orjson.dumps({"reference": content_reference(LOG)}).decode()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("first", ["client", "read"])
async def test_reads_mixed_with_client_calls_never_reach_the_client(
    client: openai.AsyncOpenAI, upstream: OpenAIUpstream, stream: bool, first: str
) -> None:
    def respond(request: dict[str, Any]) -> Reply:
        if request["messages"][-1]["role"] == "tool":  # the proxy answered the read
            return reading_chat_responder(request)
        calls = [ToolCall("call_9", "fetch_log"), ToolCall("read-0", READ_TOOL, read_call_arguments())]
        return Reply(tool_calls=tuple(calls if first == "client" else reversed(calls)))

    upstream.responder = respond
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=conversation(), tools=CLIENT_TOOLS, stream=stream
    )
    if stream:
        deltas = [choice.delta for chunk in [c async for c in raw.parse()] for choice in chunk.choices]
        names = [call.function.name for delta in deltas for call in delta.tool_calls or () if call.function.name]
        content = "".join(delta.content or "" for delta in deltas)
    else:
        message = raw.parse().choices[0].message
        names = [call.function.name for call in message.tool_calls or ()]
        content = message.content or ""
    reads = raw.headers.get("x-compaction-reads")  # a stream's headers go out before the model decides to read
    if first == "client":  # relayed as the model made it, without its read
        assert (names, content, reads) == (["fetch_log"], "", None if stream else "0")
    else:  # the read is answered and the model asked again: it answers (and may call the client tool again)
        assert (names, content, reads) == ([], f"found {SECRET}", None if stream else "1")
        assert chat_bodies(upstream)[1]["messages"][-2]["tool_calls"][0]["function"]["name"] == READ_TOOL
        assert len(chat_bodies(upstream)[1]["messages"][-2]["tool_calls"]) == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_a_responses_read_after_a_client_call_never_reaches_the_client(
    client: openai.AsyncOpenAI, upstream: OpenAIUpstream, stream: bool
) -> None:
    upstream.responses_responder = lambda _request: ResponsesReply(
        function_calls=(FunctionCall("fetch_log", call_id="call_9"), FunctionCall(READ_TOOL, read_call_arguments()))
    )
    raw = await client.responses.with_raw_response.create(
        model=MODEL, input=response_items(), tools=RESPONSES_TOOLS, stream=stream
    )
    if stream:
        events = [event async for event in raw.parse()]
        added = [event.item.name for event in events if event.type == "response.output_item.added"]
        assert added == ["fetch_log"]
        assert not any(READ_TOOL in event.model_dump_json() for event in events)
        (response,) = [event.response for event in events if event.type == "response.completed"]
    else:
        response = raw.parse()
    assert [(item.type, getattr(item, "name", None)) for item in response.output] == [("function_call", "fetch_log")]
    assert READ_TOOL not in response.model_dump_json()


async def test_reads_are_answered_on_the_retry_after_an_overflow(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    upstream.responder = lambda request: (
        Reply(content="answered from the preview")
        if request.get("tool_choice") == "none"
        else reading_chat_responder(request)
    )
    big = LOG * 2  # over the upstream's 4k window; the proxy believes the model has 16k
    async with openai.AsyncOpenAI(
        base_url=await start_proxy(context_windows={MODEL: 16_384}), api_key="k", max_retries=0
    ) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(
            model=MODEL, messages=conversation(big), tools=CLIENT_TOOLS
        )
    message = raw.parse().choices[0].message
    assert (message.content, message.tool_calls) == ("found nothing", None)
    assert raw.headers["x-compaction"] == "compacted-after-overflow"
    _overflowed, retried, asked = chat_bodies(upstream)  # the window learned from the overflow bounds the read
    assert tool_names(retried)[-1] == READ_TOOL and asked["messages"][-1]["content"] == TOO_LARGE


async def test_an_answer_too_large_to_hold_is_relayed_whole(upstream: OpenAIUpstream, start_proxy: StartProxy) -> None:
    text = "word " * 6000
    upstream.responder = lambda _request: Reply(content=text)
    upstream.context_window = 16_384
    async with openai.AsyncOpenAI(base_url=await start_proxy(max_body_bytes=20_000), api_key="k", max_retries=0) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(
            model=MODEL, messages=conversation(), tools=CLIENT_TOOLS
        )
    assert raw.headers["x-compaction-offloaded"] == "1"
    assert raw.parse().choices[0].message.content == text
