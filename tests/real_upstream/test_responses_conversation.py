"""The Responses API through the real proxy to llama-server, whose `/v1/responses` serves a real model.

A conversation on `client.responses.create`, streamed and not, grows several windows past llama-server's context:
going direct the server refuses it, through the proxy every turn is answered, compacted against the server's own
usage reports (`input_tokens`, from the JSON answer and from `response.completed`), and between compactions the
server reuses the forwarded prefix from its KV cache.

llama-server's Responses API takes messages and function call items, but emits no reasoning items and keeps no
stored responses (`previous_response_id`), so those are covered against the strict fake upstream only
(`tests/e2e/test_controls.py`, `test_long_runs.py`, `test_summaries.py`, parametrized by format).
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import openai
import pytest

from tests.real_upstream.conftest import MODEL, N_CTX, LlamaServer, Proxies
from tests.real_upstream.texts import SYSTEM_PROMPT, user_turn

pytestmark = pytest.mark.real_upstream

TURNS = 16
READINGS = 6


async def ask(client: openai.AsyncOpenAI, items: list[dict[str, Any]], stream: bool) -> tuple[list[Any], Any, str]:
    """One response through the proxy: its output items, its usage and the proxy's `X-Compaction`."""
    raw = await client.responses.with_raw_response.create(
        model=MODEL,
        instructions=SYSTEM_PROMPT,
        input=items,  # type: ignore[arg-type]
        max_output_tokens=16,
        temperature=0,
        stream=stream,
    )
    assert raw.status_code == 200
    if stream:
        response = None
        async for event in raw.parse():
            if event.type == "response.completed":
                response = event.response
        assert response is not None, "the stream ended without response.completed"
    else:
        response = raw.parse()
    return response.output, response.usage, raw.headers.get("X-Compaction", "")


async def test_a_responses_conversation_far_past_the_window(proxies: Proxies, llama_server: LlamaServer) -> None:
    base_url, _service = await proxies.start()
    client = openai.AsyncOpenAI(api_key="sk-local", base_url=base_url, max_retries=0, timeout=120)
    items: list[dict[str, Any]] = [{"role": "user", "content": user_turn(0, READINGS)}]
    usages: list[Any] = []
    headers: list[str] = []
    try:
        for turn in range(1, TURNS + 1):
            output, usage, header = await ask(client, items, stream=turn % 2 == 0)
            usages.append(usage)
            headers.append(header)
            items += [item.model_dump(exclude_none=True) for item in output]
            items.append({"role": "user", "content": user_turn(turn, READINGS)})
    finally:
        await client.close()
    print(f"\nreal_upstream responses: {json.dumps({'headers': headers, 'input': [u.input_tokens for u in usages]})}")

    assert all(usage.input_tokens < N_CTX for usage in usages)
    assert headers.count("compacted") >= 2
    # Going direct, the server refuses the history the client holds.
    async with aiohttp.ClientSession() as session:
        body = {"model": MODEL, "instructions": SYSTEM_PROMPT, "input": items, "max_output_tokens": 16}
        async with session.post(llama_server.base_url + "/v1/responses", json=body) as direct:
            assert direct.status == 400
            assert (await direct.json())["error"]["type"] == "exceed_context_size_error"
    # Between compactions the server reuses the prefix the proxy forwards unchanged.
    reused = [
        (usage.input_tokens_details.cached_tokens, previous.input_tokens)
        for previous, usage, header in zip(usages, usages[1:], headers[1:], strict=False)
        if header != "compacted"
    ]
    assert reused and all(cached >= 0.9 * before for cached, before in reused), reused
