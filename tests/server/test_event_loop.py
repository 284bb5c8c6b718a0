"""The event loop `compaction-proxy serve` runs on, and its deferred log lines: the real process, real sockets.

`event_loop: auto` runs on uvloop when it is installed (the `speed` extra, which `dev` includes), `asyncio` on
asyncio's own; the `listening` line says which. On either, every access line is written, complete and in order, by
the time the process has stopped, however fast the requests came (the lines are written on a thread of their own).
"""

from __future__ import annotations

import asyncio
import importlib.util

import aiohttp
import pytest

from proxy.simulator.openai_upstream import OpenAIUpstream, fixed_responder
from tests.support import process_proxy

start_process_proxy = process_proxy.start_process_proxy

UVLOOP = importlib.util.find_spec("uvloop") is not None
REQUESTS = 40


@pytest.mark.parametrize(
    ("chosen", "expected"),
    [("asyncio", "asyncio"), ("auto", "uvloop" if UVLOOP else "asyncio")] + ([("uvloop", "uvloop")] if UVLOOP else []),
)
async def test_serve_runs_on_the_chosen_loop_and_writes_every_access_line_by_the_time_it_stops(
    upstream: OpenAIUpstream, start_process_proxy: process_proxy.StartProcessProxy, chosen: str, expected: str
) -> None:
    upstream.responder = fixed_responder("fine")
    proxy = await start_process_proxy(upstream.base_url, event_loop=chosen)
    listening = next(record for record in proxy.records() if record.get("message") == "listening")
    assert listening["event_loop"] == expected

    async def ask(session: aiohttp.ClientSession, index: int) -> str:
        body = {"model": "gpt-4.1", "messages": [{"role": "user", "content": f"question {index}"}]}
        headers = {"Authorization": "Bearer sk-test", "X-Conversation-Id": f"conversation-{index}"}
        async with session.post(f"{proxy.url}/v1/chat/completions", json=body, headers=headers) as response:
            assert response.status == 200
            return str((await response.json())["choices"][0]["message"]["content"])

    async with aiohttp.ClientSession() as session:
        answers = await asyncio.gather(*(ask(session, index) for index in range(REQUESTS)))
    assert answers == ["fine"] * REQUESTS
    assert await proxy.stop() == 0

    records = proxy.records()
    access = [record for record in records if record.get("logger") == "compaction_proxy.access"]
    assert sorted(record["conversation_id"] for record in access) == sorted(
        f"conversation-{index}" for index in range(REQUESTS)
    )
    assert all(record["status"] == 200 and record["request_id"] for record in access)
    assert len({record["request_id"] for record in access}) == REQUESTS
    assert records[-1]["message"] == "stopped"
    times = [record["time"] for record in records]
    assert times == sorted(times)  # written in the order they were logged
