"""Traces: the real proxy exports one span per model request to a real OTLP/HTTP receiver on loopback.

The receiver (`tests.support.otlp_receiver`) decodes what arrives with the official `opentelemetry-proto` messages:
an OpenTelemetry Collector binary is not installable offline, so its OTLP/HTTP receiving half stands in for it. The
clients are the official `openai` and `anthropic` SDKs, the upstream the simulated model serving all three formats.
Spans are read once the proxy has shut down: its shutdown flushes the exporter, so no test waits on a clock.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from anthropic import AsyncAnthropic
from openai import AsyncOpenAI
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from proxy.simulator.model import Simulator
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.support.proxies import LoopbackProxies, RunningProxy

WINDOW = 8000
GPT = "gpt-4o-mini"
CLAUDE = "claude-sonnet-4-5"
KEY = "sk-trace-key-never-exported"
SECRET = "Quetzalcoatl"
"""A word in every prompt: what the model is told must never reach a span."""

PARAGRAPH = f"{SECRET} asked about the deployment, the logs and the failing test, and waited for an answer. "
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"

DOCS = Path(__file__).resolve().parents[2] / "docs" / "tracing.md"

NOT_PRODUCED_HERE = {
    "error.type": "test_a_request_the_upstream_refuses_is_a_span_with_its_error",
    "compaction_proxy.fail_open": "the access log's fail_open, from the same record (tests/e2e/test_store_outage.py)",
    "compaction_proxy.retried": "test_an_overflows_retry_is_one_span_with_the_retrys_usage",
}
"""Documented attributes the traffic of the first test does not produce, and where they are shown."""

Usage = tuple[int, int, int]
"""Input tokens (cached included), cached input tokens, output tokens: as the fake upstream reported them."""


@pytest.fixture
async def simulator() -> AsyncIterator[Simulator]:
    async with Simulator(context_window=WINDOW) as model:
        yield model


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    async with OtlpReceiver() as running:
        yield running


@pytest.fixture
async def proxies(simulator: Simulator) -> AsyncIterator[LoopbackProxies]:
    started = LoopbackProxies(upstream=simulator.base_url, context_windows={GPT: WINDOW, CLAUDE: WINDOW})
    yield started
    await started.close()


def chat_usage(usage: Mapping[str, Any]) -> Usage:
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], usage["completion_tokens"]


def responses_usage(usage: Mapping[str, Any]) -> Usage:
    return usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"], usage["output_tokens"]


def messages_usage(usage: Mapping[str, Any]) -> Usage:
    read, written = usage.get("cache_read_input_tokens", 0), usage.get("cache_creation_input_tokens", 0)
    return usage["input_tokens"] + read + written, read, usage["output_tokens"]


def history(turns: int) -> list[Any]:
    """A conversation of `turns` long questions and answers, then a short question."""
    messages: list[Any] = [{"role": "system", "content": "You are a careful assistant."}]
    for turn in range(turns):
        messages += [
            {"role": "user", "content": f"Question {turn}: " + PARAGRAPH * 6},
            {"role": "assistant", "content": PARAGRAPH * 6},
        ]
    return [*messages, {"role": "user", "content": f"{SECRET}: what went wrong?"}]


Call = Callable[[dict[str, str]], Awaitable[None]]


def calls(proxy: RunningProxy) -> dict[str, tuple[Call, str, bool]]:
    """Each request the test makes, by the conversation id it sends: the call, its provider, whether it streams."""
    openai = AsyncOpenAI(base_url=proxy.url, api_key=KEY, max_retries=0)
    anthropic = AsyncAnthropic(base_url=proxy.url.removesuffix("/v1"), api_key=KEY, max_retries=0)
    asked: Any = [{"role": "user", "content": f"{SECRET}: say hello."}]

    async def chat(headers: dict[str, str]) -> None:
        await openai.chat.completions.create(model=GPT, messages=asked, extra_headers=headers)

    async def chat_stream(headers: dict[str, str]) -> None:
        # A stream the proxy forwards as sent reports usage only when its client asks (as the Agents SDK does).
        usage: Any = {"include_usage": True}
        stream = await openai.chat.completions.create(
            model=GPT, messages=asked, stream=True, stream_options=usage, extra_headers=headers
        )
        async for _ in stream:
            pass

    async def compacted(headers: dict[str, str]) -> None:
        await openai.chat.completions.create(model=GPT, messages=history(30), extra_headers=headers)

    async def responses(headers: dict[str, str]) -> None:
        await openai.responses.create(model=GPT, input=f"{SECRET}: say hello.", extra_headers=headers)

    async def responses_stream(headers: dict[str, str]) -> None:
        async for _ in await openai.responses.create(model=GPT, input=asked, stream=True, extra_headers=headers):
            pass

    async def messages(headers: dict[str, str]) -> None:
        await anthropic.messages.create(model=CLAUDE, max_tokens=200, messages=asked, extra_headers=headers)

    async def messages_stream(headers: dict[str, str]) -> None:
        stream = await anthropic.messages.create(
            model=CLAUDE, max_tokens=200, messages=asked, stream=True, extra_headers=headers
        )
        async for _ in stream:
            pass

    return {
        "chat": (chat, "openai", False),
        "chat-stream": (chat_stream, "openai", True),
        "compacted": (compacted, "openai", False),
        "responses": (responses, "openai", False),
        "responses-stream": (responses_stream, "openai", True),
        "messages": (messages, "anthropic", False),
        "messages-stream": (messages_stream, "anthropic", True),
    }


def reported(simulator: Simulator) -> list[Usage]:
    """What the fake upstream reported for every call it answered so far, in all three formats."""
    return [
        *map(chat_usage, simulator.usages),
        *map(responses_usage, simulator.responses_usages),
        *map(messages_usage, simulator.messages_api.usages),
    ]


def added(usages: list[Usage]) -> Usage:
    """Several calls' usage summed: what a request that made them (the proxy's read rounds) cost."""
    return sum(u[0] for u in usages), sum(u[1] for u in usages), sum(u[2] for u in usages)


def strings_in(span: ReceivedSpan) -> list[str]:
    """Every string the span carries: its name, its attributes' and its resource's values, its events'."""
    values: list[Any] = [span.span.name, *span.attributes.values(), *span.resource.values()]
    values += [attribute.value.string_value for event in span.span.events for attribute in event.attributes]
    flat = [item for value in values for item in (value if isinstance(value, list) else [value])]
    return [value for value in flat if isinstance(value, str)]


def documented() -> set[str]:
    """The attribute names of docs/tracing.md's table."""
    rows = [line for line in DOCS.read_text().splitlines() if line.startswith("| `")]
    return {re.findall(r"`([^`]+)`", row)[0] for row in rows}


async def test_each_model_request_is_one_client_span_carrying_the_conventions_and_the_decision(
    simulator: Simulator, receiver: OtlpReceiver, proxies: LoopbackProxies, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_TRACES_SAMPLER"):
        monkeypatch.delenv(name, raising=False)
    proxy = await proxies.start(otel_endpoint=receiver.endpoint)
    expected: dict[str, tuple[str, bool, Usage]] = {}
    calls_made: dict[str, list[Usage]] = {}
    for case, (call, provider, streamed) in calls(proxy).items():
        headers = {"X-Conversation-Id": case}
        if case == "chat":
            headers["traceparent"] = f"00-{TRACE_ID}-{PARENT_ID}-01"
        before = len(reported(simulator))
        await call(headers)
        calls_made[case] = reported(simulator)[before:]
        expected[case] = (provider, streamed, added(calls_made[case]))
    await proxies.close()  # the proxy's shutdown flushes its exporter

    spans = {span.attributes["gen_ai.conversation.id"]: span for span in receiver.spans}
    assert len(receiver.spans) == len(expected) and set(spans) == set(expected)
    for case, (provider, streamed, (prompt, cached, output)) in expected.items():
        span, attributes = spans[case].span, spans[case].attributes
        model = CLAUDE if provider == "anthropic" else GPT
        assert span.name == f"chat {model}" and span.kind == Span.SPAN_KIND_CLIENT, case
        assert span.status.code == Status.STATUS_CODE_UNSET and "error.type" not in attributes, case
        assert span.end_time_unix_nano > span.start_time_unix_nano, case
        assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.provider.name"] == provider
        assert attributes["gen_ai.request.model"] == model
        assert attributes.get("gen_ai.request.stream", False) is streamed, case
        assert attributes["gen_ai.usage.input_tokens"] == prompt, case
        assert attributes["gen_ai.usage.cache_read.input_tokens"] == cached, case
        assert attributes["gen_ai.usage.output_tokens"] == output, case
        assert attributes["server.address"] == "127.0.0.1" and attributes["server.port"] == simulator.port
        assert attributes["http.response.status_code"] == 200 and attributes["compaction_proxy.route"], case
        assert attributes["compaction_proxy.context_window"] == WINDOW, case
        assert attributes["compaction_proxy.tokens_before"] > 0, case
        assert spans[case].resource["service.name"] == "compaction-proxy" and spans[case].scope == "compaction-proxy"
        assert not [value for value in strings_in(spans[case]) if SECRET in value or KEY in value], case
        if case != "compacted":
            assert len(calls_made[case]) == 1 and attributes["compaction_proxy.decision"] == "unchanged", case
            assert "gen_ai.conversation.compacted" not in attributes, case

    chat = spans["chat"].span
    assert chat.trace_id.hex() == TRACE_ID and chat.parent_span_id.hex() == PARENT_ID  # joins the client's trace
    compacted = spans["compacted"].attributes
    assert compacted["compaction_proxy.decision"] == "compacted" and compacted["gen_ai.conversation.compacted"]
    assert compacted["compaction_proxy.tokens_before"] > WINDOW * 0.7 > compacted["compaction_proxy.tokens_after"]
    assert compacted["compaction_proxy.strategies"] and all(compacted["compaction_proxy.strategies"])
    sent = {name for span in receiver.spans for name in span.attributes}
    assert sent <= documented() and documented() - sent == set(NOT_PRODUCED_HERE)

    # The model called the proxy's read tool: the request's usage is that of every upstream call made for it.
    assert len(calls_made["compacted"]) > 1
    assert all(prompt < WINDOW * 0.7 for prompt, _, _ in calls_made["compacted"])


async def test_a_request_the_upstream_refuses_is_a_span_with_its_error(
    simulator: Simulator, receiver: OtlpReceiver, proxies: LoopbackProxies
) -> None:
    proxy = await proxies.start(otel_endpoint=receiver.endpoint)
    anthropic = AsyncAnthropic(base_url=proxy.url.removesuffix("/v1"), api_key=KEY, max_retries=0)
    with pytest.raises(Exception, match="max_tokens"):
        await anthropic.messages.create(model=CLAUDE, messages=[{"role": "user", "content": "hi"}], max_tokens=0)
    await proxies.close()
    (span,) = receiver.spans
    assert span.attributes["error.type"] == "400" and span.span.status.code == Status.STATUS_CODE_ERROR
    assert span.attributes["http.response.status_code"] == 400 and "gen_ai.usage.input_tokens" not in span.attributes


async def test_an_overflows_retry_is_one_span_with_the_retrys_usage(
    simulator: Simulator, receiver: OtlpReceiver, proxies: LoopbackProxies
) -> None:
    """The proxy believes the window twice the upstream's: the upstream refuses, the proxy compacts and retries."""
    proxy = await proxies.start(otel_endpoint=receiver.endpoint, context_windows={GPT: 2 * WINDOW})
    openai = AsyncOpenAI(base_url=proxy.url, api_key=KEY, max_retries=0)
    await openai.chat.completions.create(model=GPT, messages=history(30))
    await proxies.close()
    (span,) = receiver.spans
    assert span.attributes["compaction_proxy.retried"] is True and span.attributes["gen_ai.conversation.compacted"]
    assert span.attributes["compaction_proxy.decision"] == "compacted-after-overflow"
    assert span.attributes["gen_ai.usage.input_tokens"] == added(reported(simulator))[0]  # the refusal reported none


OFF = """
import asyncio
import sys
import aiohttp
from aiohttp.test_utils import TestServer
from proxy.config import Settings
from proxy.pipeline.routed import build_pipeline
from proxy.server import create_app

async def main() -> None:
    settings = Settings(upstream=sys.argv[1], context_windows={"gpt-4o-mini": 8000}, window_probes=[], count_probes=[])
    server = TestServer(create_app(settings, build_pipeline(settings)), host="127.0.0.1", port=0)
    await server.start_server()
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
        async with http.post(url, json=body, headers={"Authorization": "Bearer sk-x"}) as response:
            assert response.status == 200, response.status
    await server.close()
    print(sorted(name for name in sys.modules if name.startswith(("opentelemetry", "proxy.server.otel_export"))))

asyncio.run(main())
"""


WITHOUT_OPENTELEMETRY = 'import sys\nsys.modules["opentelemetry"] = None  # as if the `otel` extra were not installed\n'


@pytest.mark.parametrize("installed", [True, False], ids=["installed", "not-installed"])
async def test_without_otel_endpoint_nothing_is_exported_and_opentelemetry_is_not_imported(
    simulator: Simulator, receiver: OtlpReceiver, installed: bool
) -> None:
    """The standard variables alone, naming a receiver that listens, turn nothing on: `otel_endpoint` does. The
    proxy serves the same without the `otel` extra."""
    environment = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint + "/v1/traces",
        "OTEL_SERVICE_NAME": "should-not-matter",
    }
    code = textwrap.dedent(OFF) if installed else WITHOUT_OPENTELEMETRY + textwrap.dedent(OFF)
    finished = await _python(code, simulator.base_url, environment)
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip() == ("[]" if installed else "['opentelemetry']")  # the blocking entry only
    assert receiver.exports == [] and len(simulator.usages) == 1


async def _python(code: str, argument: str, environment: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter (its own `sys.modules`) without blocking the loop the fakes serve on."""
    env = {**os.environ, **environment}
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", code, argument], capture_output=True, text=True, env=env, check=False
    )


async def test_env_takes_the_endpoint_and_the_service_name_from_the_standard_variables(
    simulator: Simulator, receiver: OtlpReceiver, proxies: LoopbackProxies, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "agents-gateway")
    proxy = await proxies.start(otel_endpoint="env")
    await calls(proxy)["responses"][0]({})
    await proxies.close()
    (span,) = receiver.spans
    assert span.resource["service.name"] == "agents-gateway" and span.attributes["gen_ai.provider.name"] == "openai"


async def test_a_collector_that_does_not_answer_never_fails_a_request(
    simulator: Simulator, proxies: LoopbackProxies, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spans to a port nobody listens on are retried off the request path, then dropped when the proxy stops."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # the longest the shutdown's last export may try
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    proxy = await proxies.start(otel_endpoint=f"http://127.0.0.1:{port}")
    for call, _, _ in calls(proxy).values():
        await call({})
    assert len(reported(simulator)) >= len(calls(proxy))
    await proxies.close()
