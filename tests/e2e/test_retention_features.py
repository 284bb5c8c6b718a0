"""Through the real proxy, with the `openai` SDK: an offloaded or pruned result leaves its digest, and a log's repeated
lines reach the upstream written once with their markers, every other message as the client sent it."""

from __future__ import annotations

from typing import Any

import openai

from proxy.engine.digest import digest
from proxy.engine.strategies.offload import content_reference
from proxy.engine.strategies.repeated_lines import collapsed
from proxy.engine.strategies.tool_result_pruning import DEFAULT_PLACEHOLDER
from proxy.pipeline.offload.tool import POINTER
from tests.e2e.conftest import MODEL, StartProxy
from tests.support.openai_upstream import OpenAIUpstream

WINDOW = 4400
FAILURE = "E   ImportError: cannot import name 'refund' from 'orders' (orders/__init__.py)"
BUILD_LOG = "".join(
    [
        *(f"step {i:03d}: compiled module m{i} in {i * 7 % 97} ms\n" for i in range(120)),
        f"{FAILURE}\n",
        *(f"step {i:03d}: compiled module m{i} in {i * 7 % 97} ms\n" for i in range(120, 230)),
        "build failed: 1 error\n",
    ]
)
TRACE = 'Traceback (most recent call last):\n  File "fetch.py", line 12, in <module>\nConnectionError: timed out\n'
RETRY_LOG = "$ fetch --retry 40\n" + "Downloading index... waiting for the mirror to answer\n" * 300 + TRACE * 40


def call(call_id: str, name: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": '{"target": "all"}'}}


def conversation(log: str, user_text: str = "Investigate the failed build.") -> list[dict[str, Any]]:
    """A tool-calling conversation whose first (older) result is `log`, the one compaction rewrites."""
    return [
        {"role": "system", "content": "You are a build assistant."},
        {"role": "user", "content": user_text},
        {"role": "assistant", "content": None, "tool_calls": [call("call_1", "fetch_log")]},
        {"role": "tool", "tool_call_id": "call_1", "content": log},
        {"role": "assistant", "content": None, "tool_calls": [call("call_2", "check_status")]},
        {"role": "tool", "tool_call_id": "call_2", "content": "status: red"},
        {"role": "user", "content": "What broke?"},
    ]


async def send(base_url: str, messages: list[dict[str, Any]], headers: dict[str, str] | None = None) -> Any:
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0) as client:
        return await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            extra_headers=headers or {},
        )


async def test_an_offloaded_result_leaves_a_digest_and_the_replay_keeps_it_byte_for_byte(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    upstream.context_window = WINDOW
    base_url = await start_proxy(context_windows={MODEL: WINDOW})
    first = conversation(BUILD_LOG)
    raw = await send(base_url, first)
    assert raw.headers["X-Compaction-Offloaded"] == "1"
    sent = upstream.requests[-1].json["messages"]
    pointer = POINTER.replace("{reference}", content_reference(BUILD_LOG))
    assert sent[3]["content"] == pointer + "\n" + digest(first[3], first[2]["tool_calls"][0])
    lines = sent[3]["content"].splitlines()
    assert lines[1] == 'Digest of fetch_log({"target": "all"}): 232 lines, ' + f"{len(BUILD_LOG)} characters."
    assert f"error: {FAILURE}" in lines and lines[-1] == "last: build failed: 1 error"
    later = [
        *first,
        {"role": "assistant", "content": "The import of `refund` fails."},
        {"role": "user", "content": "Fix it."},
    ]
    await send(base_url, later)
    assert upstream.requests[-1].json["messages"][: len(sent)] == sent, "the digest is replayed as it was sent"


async def test_a_pruned_result_leaves_the_placeholder_and_a_digest(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    upstream.context_window = WINDOW
    base_url = await start_proxy(context_windows={MODEL: WINDOW})
    messages = conversation(BUILD_LOG)
    raw = await send(base_url, messages, {"X-Compaction-Offload": "off"})
    assert "tool_result_pruning" in raw.headers["X-Compaction-Strategies"].split(",")
    placeholder = DEFAULT_PLACEHOLDER.replace("{tool_name}", "fetch_log")
    expected = placeholder + "\n" + digest(messages[3], messages[2]["tool_calls"][0])
    assert upstream.requests[-1].json["messages"][3]["content"] == expected
    assert f"error: {FAILURE}" in expected


async def test_a_logs_repeated_lines_are_written_once_and_the_users_words_are_not_touched(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    upstream.context_window = WINDOW
    base_url = await start_proxy(context_windows={MODEL: WINDOW})
    pasted = "It printed this:\n" + "Downloading index... waiting for the mirror to answer\n" * 12
    messages = conversation(RETRY_LOG, pasted)
    raw = await send(base_url, messages)
    assert raw.headers["X-Compaction-Strategies"] == "repeated_lines", "the lossless step was enough"
    sent = upstream.requests[-1].json["messages"]
    assert sent[3]["content"] == collapsed(RETRY_LOG)
    assert sent[3]["content"].splitlines()[1:3] == [
        "Downloading index... waiting for the mirror to answer",
        "[the previous line repeats 299 more times]",
    ]
    assert "[the previous 3 lines repeat 39 more times]" in sent[3]["content"]
    assert [message for index, message in enumerate(sent) if index != 3] == [
        message for index, message in enumerate(messages) if index != 3
    ], "the user's pasted log and every other message go as sent"
