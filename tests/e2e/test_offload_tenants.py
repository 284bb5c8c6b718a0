"""One tenant's flood of offloaded results never takes another tenant's for good, through the real proxy on loopback.

Tenant A's conversation has a result offloaded and read back; then others flood the proxy with offloaded results far
beyond `state_offload_max_bytes`. A's next turn replays its rewrite (the reference, not the text, goes upstream), and
the model's read of it still returns the original: a single flooding tenant evicts only its own results, and a
result evicted all the same (many tenants flooding at once) is found in the original A's client re-sends and stored
again.
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import openai

from proxy.engine.strategies.offload import content_reference
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.conftest import MODEL, StartProxy
from tests.e2e.test_offload_reads import CLIENT_TOOLS, LOG, SECRET, conversation
from tests.support.reading_model import reading_chat_responder

RESULTS_HELD = 4
"""The budget holds about this many results the size of `LOG`."""
FLOOD = 12
"""Offloaded results the flood writes: three times the budget."""


async def turn(base_url: str, api_key: str, history: list[dict[str, Any]]) -> tuple[str, dict[str, str]]:
    """One request of a tenant: the model's answer and the response headers."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(model=MODEL, messages=history, tools=CLIENT_TOOLS)  # type: ignore[arg-type]
    return raw.parse().choices[0].message.content or "", dict(raw.headers)


async def metric(base_url: str, name: str) -> float:
    async with aiohttp.ClientSession() as http, http.get(base_url.removesuffix("/v1") + "/metrics") as got:
        text = await got.text()
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def a_conversation_outlives_a_flood(start_proxy: StartProxy, flooders: list[str]) -> str:
    """A's two turns around a flood of `FLOOD` results by `flooders` in turn; returns the proxy's base URL."""
    base_url = await start_proxy(state_offload_max_bytes=RESULTS_HELD * (len(LOG) + 400))
    history = conversation()
    answer, headers = await turn(base_url, "sk-alice", history)
    assert (answer, headers["x-compaction-reads"]) == (f"found {SECRET}", "1")
    for number in range(FLOOD):
        flooded = LOG.replace(SECRET, f"SECRET-{9000 + number}")
        answer, _headers = await turn(base_url, flooders[number % len(flooders)], conversation(flooded))
        assert answer == f"found SECRET-{9000 + number}"
    history += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Once more?"}]
    answer, headers = await turn(base_url, "sk-alice", history)
    assert headers["x-compaction"] == "unchanged"  # the rewrite replayed: the reference went upstream, not the text
    assert (answer, headers["x-compaction-reads"]) == (f"found {SECRET}", "1")
    return base_url


async def test_one_tenant_flooding_evicts_only_its_own_results(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    upstream.responder = reading_chat_responder
    base_url = await a_conversation_outlives_a_flood(start_proxy, ["sk-mallory"])
    assert await metric(base_url, "compaction_proxy_offload_restored_total") == 0  # A's was held all along
    assert await metric(base_url, 'compaction_proxy_offload_evictions_total{reason="share"}') >= FLOOD - RESULTS_HELD
    assert await metric(base_url, 'compaction_proxy_offload_evictions_total{reason="budget"}') == 0
    assert upstream.chat_requests[-1]["messages"][-1]["content"] == LOG


async def test_a_result_evicted_all_the_same_is_stored_again_from_the_resent_original(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    upstream.responder = reading_chat_responder
    flooders = [f"sk-mallory-{number}" for number in range(FLOOD)]  # each within its share: anyone's oldest goes
    base_url = await a_conversation_outlives_a_flood(start_proxy, flooders)
    assert await metric(base_url, "compaction_proxy_offload_restored_total") == 1
    assert await metric(base_url, 'compaction_proxy_offload_evictions_total{reason="budget"}') > 0
    assert upstream.chat_requests[-1]["messages"][-1]["content"] == LOG
    assert content_reference(LOG) in upstream.chat_requests[-2]["messages"][3]["content"]
