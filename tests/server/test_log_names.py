"""What an operator filters logs by: every line the proxy writes names a `compaction_proxy.*` logger, and what the
proxy learns about a model's window is said once, in a line that carries the request's id."""

from __future__ import annotations

from typing import Any

import aiohttp

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.support.process_proxy import ProcessProxy

MODEL = "gpt-4o-mini"
UPSTREAM_WINDOW = 4096


def long_conversation(turns: int) -> dict[str, Any]:
    messages = [{"role": "system", "content": "You are terse."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: " + "why is the build red? " * 40})
        messages.append({"role": "assistant", "content": "Because a test failed. " * 40})
    messages.append({"role": "user", "content": "Which test?"})
    return {"model": MODEL, "messages": messages}


async def test_every_logger_is_the_proxys_and_a_learned_window_is_logged_once() -> None:
    # The shipped table says 128k for this model; the upstream serves it with 4k, and says so only by refusing.
    async with (
        OpenAIUpstream(context_window=UPSTREAM_WINDOW) as upstream,
        ProcessProxy(upstream.base_url) as proxy,
        aiohttp.ClientSession() as http,
    ):
        for turns in (12, 14):
            async with http.post(
                proxy.url + "/v1/chat/completions",
                json=long_conversation(turns),
                headers={"Authorization": "Bearer sk-logs"},
            ) as response:
                assert response.status == 200, await response.text()
        async with http.get(proxy.url + "/v1/models", headers={"Authorization": "Bearer sk-logs"}) as response:
            await response.read()
        records = proxy.records()
    assert records and all(record["logger"].startswith("compaction_proxy.") for record in records), {
        record["logger"] for record in records
    }
    learned = [record for record in records if record["message"].startswith("Learned from the upstream's overflow")]
    assert len(learned) == 1 and f"{UPSTREAM_WINDOW} tokens" in learned[0]["message"]
    access = {record["request_id"] for record in records if record["logger"] == "compaction_proxy.access"}
    assert learned[0]["request_id"] in access
    # The upstream reports no window for it: the shipped table's is used, and nobody is told to configure one.
    [unreported] = [record for record in records if "reported no context window" in record["message"]]
    assert "the shipped table's 128000 tokens are used" in unreported["message"]
    assert "Set context_windows" not in unreported["message"]


async def test_an_upstream_that_refuses_connections_is_logged_as_unreachable_not_as_windowless() -> None:
    async with OpenAIUpstream() as upstream:
        refusing = upstream.base_url
    async with ProcessProxy(refusing) as proxy, aiohttp.ClientSession() as http:
        async with http.post(proxy.url + "/v1/chat/completions", json=long_conversation(1)) as response:
            assert response.status == 502
        record = await proxy.wait_for_log(lambda record: "context window" in record["message"])
        records = proxy.records()
    assert record["message"].startswith("Could not reach the upstream to ask for model 'gpt-4o-mini'")
    assert not [record for record in records if "reported no context window" in record["message"]]
