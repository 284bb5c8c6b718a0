"""One decision wherever it is asked for: observe reports what enforce does, `compact` prints what `serve` forwards,
and offloading never costs more of a conversation than pruning."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import orjson
import pytest

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.conftest import MODEL, StartProxy
from tests.e2e.test_offload_reads import CLIENT_TOOLS, conversation
from tests.support.chat_requests import history, post

DECISION_HEADERS = ("X-Compaction-Tokens-Before", "X-Compaction-Tokens-After", "X-Compaction-Strategies")


def tool_conversation(steps: int) -> bytes:
    """A tool loop with `steps` large results, the kind offloading and pruning act on."""
    messages: list[dict[str, Any]] = conversation()[:2]
    for step in range(steps):
        call = {"id": f"call_{step}", "type": "function", "function": {"name": "fetch_log", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        log = "".join(f"step {step}.{line}: compiled module m{line}\n" for line in range(60))
        messages.append({"role": "tool", "tool_call_id": f"call_{step}", "content": log})
    messages.append({"role": "user", "content": "Which step failed?"})
    return orjson.dumps({"model": MODEL, "messages": messages, "tools": CLIENT_TOOLS})


@pytest.mark.parametrize(
    "body",
    [
        history(30),
        tool_conversation(6),
        tool_conversation(20),
        orjson.dumps({"model": MODEL, "messages": conversation()}),
    ],
    ids=["turns", "few-results", "many-results", "one-large-result"],
)
async def test_observe_reports_what_enforce_does(
    upstream: OpenAIUpstream, start_proxy: StartProxy, body: bytes
) -> None:
    upstream.context_window = 1_000_000  # observe forwards the whole body: the upstream must take it
    observing, enforcing = await start_proxy(mode="observe"), await start_proxy()

    status, observed, _ = await post(observing, body)
    assert status == 200
    status, enforced, _ = await post(enforcing, body)
    assert status == 200

    assert enforced["X-Compaction"] == "compacted"
    assert observed["X-Compaction"] == "would-compact"
    assert {name: observed.get(name) for name in DECISION_HEADERS} == {
        name: enforced.get(name) for name in DECISION_HEADERS
    }
    assert upstream.requests[0].body == body


@pytest.mark.parametrize("window", [4096, 8192, 16384])
@pytest.mark.parametrize("steps", [30, 60, 120])
async def test_offloading_keeps_as_many_messages_as_pruning(
    upstream: OpenAIUpstream, start_proxy: StartProxy, window: int, steps: int
) -> None:
    upstream.context_window = window
    base_url = await start_proxy()
    body = tool_conversation(steps)

    kept = {}
    for offload in ("on", "off"):
        status, headers, _ = await post(
            base_url, body, key=f"sk-{offload}", **{"X-Context-Window": str(window), "X-Compaction-Offload": offload}
        )
        assert status == 200
        assert headers["X-Compaction"] == "compacted"
        kept[offload] = len(orjson.loads(upstream.requests[-1].body)["messages"])

    assert kept["on"] >= kept["off"]


@pytest.mark.parametrize("offload", ["on", "off"])
@pytest.mark.parametrize("steps", [12, 30])
async def test_compact_prints_what_serve_forwards(
    upstream: OpenAIUpstream, start_proxy: StartProxy, offload: str, steps: int
) -> None:
    window = 8192
    upstream.context_window = window
    base_url = await start_proxy()
    body = tool_conversation(steps)
    status, headers, _ = await post(
        base_url, body, **{"X-Context-Window": str(window), "X-Compaction-Offload": offload}
    )
    assert status == 200 and headers["X-Compaction"] == "compacted"

    flags = ["--no-offload"] if offload == "off" else []
    command = [sys.executable, "-m", "proxy.cli", "compact", "-", "--context-window", str(window), *flags]
    printed = await asyncio.to_thread(subprocess.run, command, input=body, capture_output=True, timeout=120, check=True)

    assert orjson.loads(printed.stdout) == orjson.loads(upstream.requests[-1].body)
    strategies = headers["X-Compaction-Strategies"].replace(",", ", ")
    assert f"strategies: {strategies};".encode() in printed.stderr
