"""Through the real proxy, recognizing each next request from its bytes changes nothing the upstream receives.

The same Haystack Agent (its `OpenAIChatGenerator` is the openai SDK) runs the same tool loop twice at a small
window, once through a proxy whose compaction service recognizes re-sent conversations from their bytes and splices
what it forwards, once through a proxy that parses every request in full. Both upstreams record every body byte for
byte: they must be the same, compactions and replayed rewrites included.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from itertools import pairwise

import pytest
from aiohttp.test_utils import TestServer
from haystack.dataclasses import ChatMessage, StreamingChunk

from proxy.config import Settings
from proxy.pipeline.service import CompactionPipeline
from proxy.server import create_app
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.conftest import MODEL, WINDOW
from tests.e2e.test_same_decision import API_KEY_VAR, STEPS, TASK, agent_at
from tests.hooks.conftest import stepping_responder


@pytest.fixture(autouse=True)
def _api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_VAR, "sk-test")


Streaming = Callable[[StreamingChunk], Awaitable[None]]


async def bodies_through_proxy(splice: bool, streaming: Streaming | None) -> list[bytes]:
    """Every chat body the upstream received while the Agent ran through a proxy with or without the shortcut."""
    async with OpenAIUpstream(stepping_responder(STEPS), context_window=WINDOW) as upstream:
        settings = Settings(upstream=upstream.base_url, context_windows={MODEL: WINDOW})
        service = CompactionPipeline(settings, splice_from=0 if splice else None)
        server = TestServer(create_app(settings, service), host="127.0.0.1", port=0)
        await server.start_server()
        try:
            agent = agent_at(f"http://127.0.0.1:{server.port}/v1")
            agent.warm_up()
            await agent.run_async(messages=[ChatMessage.from_user(TASK)], streaming_callback=streaming)
        finally:
            await server.close()
        return [request.body for request in upstream.requests if request.path.endswith("/chat/completions")]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_the_upstream_receives_the_same_bytes_with_and_without_the_shortcut(stream: bool) -> None:
    chunks: list[StreamingChunk] = []

    async def collect(chunk: StreamingChunk) -> None:
        chunks.append(chunk)

    streaming = collect if stream else None
    spliced = await bodies_through_proxy(splice=True, streaming=streaming)
    full = await bodies_through_proxy(splice=False, streaming=streaming)
    assert len(spliced) == STEPS + 1
    assert sum(len(after) < len(before) for before, after in pairwise(spliced)) >= 2, (
        "the proxy compacted fewer than twice"
    )
    for index, (through_shortcut, through_full_path) in enumerate(zip(spliced, full, strict=True)):
        assert through_shortcut == through_full_path, f"request {index} differs"
    assert not stream or chunks, "the stream was not relayed"
