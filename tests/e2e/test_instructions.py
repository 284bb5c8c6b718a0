"""Instructions are sacred: every request the upstream receives carries them byte for byte, through every compaction.

Two real clients through the real proxy, over many turns of a tool loop, against an upstream as strict as OpenAI's:

- a Codex-shaped Responses client: no `instructions`, a large base prompt and skills as leading `developer` items,
  then its AGENTS.md and environment as user items of its own, then the user's task;
- a chat client whose system prompt alone is near the compaction target.

Before the leading block was protected, `middle_out` cut the largest leading message and the next sliding window
dropped the cut copy and the environment item. And when the instructions and tools alone leave no room, the client
is told so; when they alone exceed the window, the request goes as it came.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from proxy.simulator.openai_upstream import OpenAIUpstream, RecordedRequest, tool_loop_responder
from proxy.simulator.responses_api import responses_tool_loop_responder
from tests.support.agent_run import TOOLS as CHAT_TOOLS
from tests.support.chat_requests import post
from tests.support.proxies import LoopbackProxies

MODEL = "gpt-4.1"
WINDOW = 16_000
FILE_TEXT = "def handler(event, context):\n    return process(event['records'], retries=3)\n"
RESPONSES_TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "shell",
        "description": "Run a shell command in the workspace.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    }
]


def rules(name: str, count: int) -> str:
    """A long prompt of distinct lines, so a cut anywhere in it shows."""
    return "".join(
        f"{name} rule {n}: keep handler {n} idempotent and log retry {n * 7} with its cause.\n" for n in range(count)
    )


def text_item(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


CODEX_LEAD = [
    text_item("developer", "You are Codex, a coding agent.\n" + rules("base", 300)),
    text_item("developer", "<skills>\n" + rules("skill", 60) + "</skills>"),
    text_item("user", "# AGENTS.md instructions for /repo\n\n<INSTRUCTIONS>\nRun ruff and pytest.\n</INSTRUCTIONS>"),
    text_item(
        "user",
        "<environment_context>\n  <cwd>/repo</cwd>\n  <shell>bash</shell>\n  <sandbox_mode>workspace-write"
        "</sandbox_mode>\n</environment_context>",
    ),
]
SYSTEM = {"role": "system", "content": "You are a meticulous code reviewer.\n" + rules("review", 420)}


@pytest.fixture
async def upstream() -> AsyncIterator[OpenAIUpstream]:
    responses = responses_tool_loop_responder("shell", steps=6, arguments=lambda step, _k: {"command": f"cat f{step}"})
    chat = tool_loop_responder("read_file", steps=6, arguments=lambda step, _k: {"path": f"src/{step}.py"})
    async with OpenAIUpstream(chat, context_window=WINDOW, responses_responder=responses) as fake:
        yield fake


@pytest.fixture
async def proxies(upstream: OpenAIUpstream) -> AsyncIterator[LoopbackProxies]:
    started = LoopbackProxies(upstream=upstream.base_url, context_windows={MODEL: WINDOW})
    yield started
    await started.close()


def carries(request: RecordedRequest, texts: list[str]) -> bool:
    """Whether the forwarded body holds each text as one JSON string, byte for byte (the texts are ASCII)."""
    return all(json.dumps(text).encode() in request.body for text in texts)


async def codex_turns(client: openai.AsyncOpenAI, tasks: int) -> list[str]:
    """A Codex-shaped agent: its leading items every request, a tool loop per task; the `X-Compaction` of each."""
    items: list[dict[str, Any]] = [*CODEX_LEAD]
    headers: list[str] = []
    for task in range(tasks):
        items.append(text_item("user", f"Task {task}: find why handler {task} retries forever and fix it."))
        while True:
            raw = await client.responses.with_raw_response.create(
                model=MODEL, extra_body={"input": items}, tools=RESPONSES_TOOLS, store=False
            )
            headers.append(raw.headers.get("x-compaction", ""))
            output = [item.model_dump(exclude_none=True) for item in raw.parse().output]
            items.extend(output)
            calls = [item for item in output if item["type"] == "function_call"]
            if not calls:
                break
            for call in calls:
                items.append({"type": "function_call_output", "call_id": call["call_id"], "output": FILE_TEXT * 14})
    return headers


async def test_a_codex_shaped_client_keeps_its_developer_and_environment_items(
    upstream: OpenAIUpstream, proxies: LoopbackProxies
) -> None:
    proxy = await proxies.start()
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-test", max_retries=0) as client:
        headers = await codex_turns(client, tasks=6)

    assert headers.count("compacted") >= 2, headers
    received = [request for request in upstream.requests if request.path == "/v1/responses"]
    assert len(received) == len(headers)
    texts = [item["content"][0]["text"] for item in CODEX_LEAD]
    for number, (request, body) in enumerate(zip(received, upstream.responses_requests, strict=True)):
        assert "instructions" not in body
        assert body["input"][: len(CODEX_LEAD)] == CODEX_LEAD, f"request {number} ({headers[number]}) lost them"
        assert carries(request, texts), f"request {number} does not carry them byte for byte"


async def chat_turns(base_url: str, tasks: int) -> list[str]:
    """A chat agent with a long system prompt, through aiohttp; the `X-Compaction` of each request."""
    messages: list[dict[str, Any]] = [SYSTEM]
    headers: list[str] = []
    for task in range(tasks):
        messages.append({"role": "user", "content": f"Task {task}: review handler {task} and report."})
        while True:
            body = json.dumps({"model": MODEL, "messages": messages, "tools": CHAT_TOOLS}).encode()
            status, answered, reply = await post(base_url, body)
            assert status == 200, reply
            headers.append(answered.get("X-Compaction", ""))
            message = reply["choices"][0]["message"]
            messages.append({key: value for key, value in message.items() if value is not None})
            if not message.get("tool_calls"):
                break
            for call in message["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": FILE_TEXT * 14})
    return headers


async def test_a_system_prompt_near_the_target_reaches_every_request(
    upstream: OpenAIUpstream, proxies: LoopbackProxies
) -> None:
    proxy = await proxies.start()
    headers = await chat_turns(proxy.url, tasks=6)

    assert headers.count("compacted") >= 2, headers
    received = [request for request in upstream.requests if request.path == "/v1/chat/completions"]
    assert len(received) == len(headers)
    for number, request in enumerate(received):
        assert request.json["messages"][0] == SYSTEM, f"request {number} ({headers[number]}) lost it"
        assert carries(request, [SYSTEM["content"]]), f"request {number} does not carry it byte for byte"


async def metric(proxy_url: str, limit: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(proxy_url.removesuffix("/v1") + "/metrics") as response:
        text = await response.text()
    name = f'compaction_proxy_instructions_without_room_total{{limit="{limit}"}}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def conversation(system: str, turns: int) -> bytes:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for turn in range(turns):
        messages += [
            {"role": "user", "content": f"Question {turn}: " + FILE_TEXT * 20},
            {"role": "assistant", "content": FILE_TEXT * 20},
        ]
    messages.append({"role": "user", "content": "Which handler retries forever?"})
    return json.dumps({"model": MODEL, "messages": messages, "tools": CHAT_TOOLS}).encode()


async def test_instructions_over_the_target_are_kept_and_the_client_is_told(
    upstream: OpenAIUpstream, proxies: LoopbackProxies, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = await proxies.start()
    system = rules("long", 600)  # about 8k tokens: over the 6.4k target, well inside the 16k window
    status, headers, _ = await post(proxy.url, conversation(system, 40))
    assert status == 200
    assert headers["X-Compaction"] == "compacted"
    assert headers["X-Compaction-Instructions"] == "over-target"
    assert upstream.requests[-1].json["messages"][0] == {"role": "system", "content": system}
    assert await metric(proxy.url, "over_target") == 1
    logged = [record for record in caplog.records if "leave no room" in record.getMessage()]
    assert len(logged) == 1 and "long rule" not in logged[0].getMessage()


async def test_instructions_over_the_window_go_as_they_came(
    upstream: OpenAIUpstream, proxies: LoopbackProxies, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = await proxies.start()
    body = conversation(rules("huge", 1300), 10)  # the system prompt alone is over the 16k window
    status, headers, _ = await post(proxy.url, body)
    assert status == 400  # the upstream's own answer: nothing the proxy may touch would make it fit
    assert headers["X-Compaction"] == "unchanged"
    assert headers["X-Compaction-Instructions"] == "over-window"
    assert [request.body for request in upstream.requests] == [body], "forwarded once, as it came, no retry"
    assert await metric(proxy.url, "over_window") == 1
    assert len([record for record in caplog.records if "exceed the context window" in record.getMessage()]) == 1
