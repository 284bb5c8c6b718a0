"""A run that touches every figure of the dashboard and every panel of the Grafana board, through the real proxy.

With the official SDK against the OpenAI-like upstream: a compacting tool-using agent (compactions, tokens, cached
prompt tokens, estimate error), an older large tool result offloaded and read back, an overflow after a too-large
`X-Context-Window` (a window learned, a retry), a request on the learned window, Responses API calls, and an upstream
that drops one connection (an upstream error).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import openai

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.conftest import MODEL
from tests.e2e.test_offload_reads import CLIENT_TOOLS, conversation
from tests.support.agent_run import TOOLS, agent_responder, run_agent
from tests.support.chat_requests import history
from tests.support.reading_model import reading_chat_responder


async def exercise(base_url: str, upstream: OpenAIUpstream, *, tasks: int = 2, key: str = "sk-dashboard") -> None:
    """Send the run (see the module docstring) to the proxy at `base_url` (its `/v1`) as the caller with `key`.

    A run repeated with the same `key` finds its overflow already learned and its compactions remembered: give
    each repetition a key of its own.
    """
    async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0) as client:
        upstream.responder = agent_responder()

        async def turn(messages: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=messages,  # type: ignore[arg-type]
                tools=TOOLS,  # type: ignore[arg-type]
            )
            return raw.parse().choices[0].message.model_dump(exclude_none=True), raw.headers.get("x-compaction", "")

        await run_agent(turn, tasks=tasks, steps=12)

        upstream.responder = reading_chat_responder
        await client.chat.completions.create(model=MODEL, messages=conversation(), tools=CLIENT_TOOLS)  # type: ignore[arg-type]

        root = base_url.removesuffix("/v1")
        async with aiohttp.ClientSession() as http:
            overflowing = {"Authorization": f"Bearer {key}", "X-Context-Window": "100000"}
            async with http.post(f"{base_url}/chat/completions", data=history(30), headers=overflowing) as response:
                assert response.headers["X-Compaction"] == "compacted-after-overflow", response.headers
            on_learned = {"Authorization": f"Bearer {key}"}
            async with http.post(f"{base_url}/chat/completions", data=history(2), headers=on_learned) as response:
                assert response.headers["X-Compaction-Window-Source"] == "learned"
            upstream.fail_next(reset=True)
            embedding = {"model": "text-embedding-3-small", "input": "hello"}
            async with http.post(f"{root}/v1/embeddings", json=embedding, headers=on_learned) as response:
                assert response.status == 502, response.status

        for question in range(3):
            await client.responses.create(model=MODEL, input=f"Question {question}: what changed?")
