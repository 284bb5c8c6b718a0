"""What users steer and see: the off switch, windows, overflow retry, tenant isolation, headers and metrics."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import orjson

from proxy.pipeline.prepared import RELEASE_FROM_BYTES
from tests.e2e.conftest import MODEL, StartProxy
from tests.support.openai_upstream import OpenAIUpstream

PARAGRAPH = "The deploy failed because the migration locked the orders table for eleven minutes. "


def history(turns: int, model: str = MODEL) -> bytes:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: " + PARAGRAPH * 8})
        messages.append({"role": "assistant", "content": PARAGRAPH * 8})
    messages.append({"role": "user", "content": "What went wrong, in one line?"})
    return json.dumps({"model": model, "messages": messages}).encode()


async def post(base_url: str, body: bytes, key: str = "sk-alice", **headers: str) -> tuple[int, dict[str, str], Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{base_url}/chat/completions", data=body, headers={"Authorization": f"Bearer {key}", **headers}
        ) as response,
    ):
        return response.status, dict(response.headers), await response.json()


async def test_off_switch_forwards_untouched(upstream: OpenAIUpstream, start_proxy: StartProxy) -> None:
    upstream.context_window = 1_000_000
    base_url = await start_proxy()
    body = history(30)
    status, headers, _ = await post(base_url, body, **{"X-Compaction": "off"})
    assert status == 200
    assert headers["X-Compaction"] == "skipped"
    assert upstream.requests[-1].body == body


async def test_unknown_model_is_forwarded_uncompacted(upstream: OpenAIUpstream, start_proxy: StartProxy) -> None:
    upstream.context_window = 1_000_000
    base_url = await start_proxy()
    body = history(30, model="acme-private-model")
    status, headers, _ = await post(base_url, body)
    assert status == 200
    assert headers["X-Compaction"] == "unknown-window"
    assert upstream.requests[-1].body == body


async def test_request_header_sets_the_window(upstream: OpenAIUpstream, start_proxy: StartProxy) -> None:
    upstream.context_window = 1_000_000
    base_url = await start_proxy()
    status, headers, _ = await post(base_url, history(30, model="acme-private-model"), **{"X-Context-Window": "3000"})
    assert status == 200
    assert headers["X-Compaction"] == "compacted"
    assert headers["X-Compaction-Context-Window"] == "3000"
    assert int(headers["X-Compaction-Tokens-After"]) <= 0.4 * 3000 < int(headers["X-Compaction-Tokens-Before"])
    assert upstream.usages[-1]["prompt_tokens"] <= 0.4 * 3000


async def test_overflow_is_compacted_and_retried_once(upstream: OpenAIUpstream, start_proxy: StartProxy) -> None:
    # The proxy believes the window is 16k; the upstream only has 4k and says so in its error.
    base_url = await start_proxy(context_windows={MODEL: 16_384})
    status, headers, reply = await post(base_url, history(20))
    assert status == 200, reply
    assert headers["X-Compaction"] == "compacted-after-overflow"
    assert headers["X-Compaction-Context-Window"] == "4096"
    assert int(headers["X-Compaction-Tokens-After"]) <= 0.4 * 4096
    chat = [request for request in upstream.requests if request.path.endswith("/chat/completions")]
    assert len(chat) == 2  # the rejected original, then one compacted retry
    # The retry's compaction is counted as one (by strategy and tokens), the request once, as first decided.
    async with aiohttp.ClientSession() as http, http.get(base_url.removesuffix("/v1") + "/metrics") as response:
        metrics = await response.text()
    assert "compaction_proxy_tokens_after_count 1.0" in metrics
    assert 'compaction_proxy_overflow_retries_total{result="compacted"} 1.0' in metrics
    assert 'compaction_proxy_outcomes_total{api="chat_completions",outcome="compacted"}' not in metrics
    # The learned window holds for the next request: compacted up front, no second rejection.
    status, headers, _ = await post(base_url, history(21))
    assert status == 200
    assert headers["X-Compaction"] == "compacted"
    assert len([r for r in upstream.requests if r.path.endswith("/chat/completions")]) == 3


async def test_a_large_request_is_retried_after_an_overflow_too(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    # Over RELEASE_FROM_BYTES the proxy lets go of the parsed request while the upstream answers: it parses it again.
    upstream.context_window = 32_768
    base_url = await start_proxy(context_windows={MODEL: 1_000_000})
    body = history(200)
    assert len(body) >= RELEASE_FROM_BYTES
    status, headers, reply = await post(base_url, body)
    assert status == 200, reply
    assert headers["X-Compaction"] == "compacted-after-overflow"
    assert headers["X-Compaction-Context-Window"] == "32768"
    assert upstream.usages[-1]["prompt_tokens"] <= 0.4 * 32_768


def extended(body: bytes) -> bytes:
    """The next turn of a conversation: its reply and one more question appended."""
    document = json.loads(body)
    document["messages"] += [{"role": "assistant", "content": "A lock."}, {"role": "user", "content": "And then?"}]
    return json.dumps(document).encode()


async def test_two_credentials_share_no_state(upstream: OpenAIUpstream, start_proxy: StartProxy) -> None:
    upstream.context_window = 1_000_000
    base_url = await start_proxy()
    window = {"X-Context-Window": "6000"}
    # Alice's long conversation is compacted, and the proxy remembers the rewrite for it...
    _status, headers, _ = await post(base_url, history(30), **window)
    assert headers["X-Compaction"] == "compacted"
    alice_sent = orjson.loads(upstream.requests[-1].body)["messages"]
    # ...but Bob's next turn of the very same conversation finds none of it: he is compacted afresh...
    _status, headers, _ = await post(base_url, extended(history(30)), key="sk-bob", **window)
    assert headers["X-Compaction"] == "compacted"
    # ...while Alice's next turn replays her rewrite, which leaves it under the trigger: the prefix stays as sent.
    _status, headers, _ = await post(base_url, extended(history(30)), **window)
    assert headers["X-Compaction"] == "unchanged"
    assert orjson.loads(upstream.requests[-1].body)["messages"][: len(alice_sent)] == alice_sent


async def test_a_window_override_is_not_remembered(upstream: OpenAIUpstream, start_proxy: StartProxy) -> None:
    upstream.context_window = 1_000_000
    base_url = await start_proxy(context_windows={})  # the model's own window: 128k
    _status, headers, _ = await post(base_url, history(30), **{"X-Context-Window": "6000"})
    assert headers["X-Compaction"] == "compacted"
    # The next turn without the override, under the model's own window, is forwarded whole.
    _status, headers, _ = await post(base_url, extended(history(30)))
    assert headers["X-Compaction"] == "unchanged"
    assert upstream.requests[-1].body == extended(history(30))


async def test_metrics_count_compactions_by_strategy(upstream: OpenAIUpstream, start_proxy: StartProxy) -> None:
    upstream.context_window = 1_000_000
    base_url = await start_proxy()
    await post(base_url, history(30), **{"X-Context-Window": "3000"})
    async with aiohttp.ClientSession() as http, http.get(base_url.removesuffix("/v1") + "/metrics") as response:
        text = await response.text()
    assert 'compaction_proxy_compactions_total{strategy="sliding_window"} 1.0' in text
    assert 'compaction_proxy_outcomes_total{api="chat_completions",outcome="compacted"} 1.0' in text
