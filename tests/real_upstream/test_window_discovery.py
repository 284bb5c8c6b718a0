"""Zero configuration against llama-server: the proxy asks the server for its window and never overflows it.

No window is given anywhere (no `context_windows`, no default, no `X-Context-Window`, and the table does not know
SmolLM2). Without discovery the proxy forwarded such a model's requests uncompacted until the server refused one for
overflow, then learned the window from the error and retried. With it, the first request already carries the
server's window (from `/props`), and a 40-turn conversation several times that window is compacted before it
overflows: no request is ever refused and retried. The server also counts each prompt exactly (`/apply-template` and
`/tokenize`), so the proxy's estimate matches the server's `prompt_tokens` from the first request on, where tiktoken
alone was 32% off until calibration caught up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.config.compaction import DEFAULT_COUNT_PROBES
from tests.real_upstream.conftest import MODEL, N_CTX, LlamaServer, Proxies
from tests.real_upstream.test_sdk_conversation import proxy_estimate
from tests.real_upstream.texts import SYSTEM_PROMPT, sensor_log, user_turn

pytestmark = pytest.mark.real_upstream

TURNS = 40
MAX_TOKENS = 16
READINGS = 6
"""Readings per user turn (about 140 server tokens): 40 turns are about three windows."""


async def test_the_first_request_already_knows_the_servers_window(proxies: Proxies, llama_server: LlamaServer) -> None:
    # Generous wait budgets: what is tested is what the server says, not how fast it says it on a busy machine.
    base_url, _service = await proxies.start(
        context_windows={}, discovery_timeout=5.0, count_probes=list(DEFAULT_COUNT_PROBES), exact_count_timeout=5.0
    )
    client = openai.AsyncOpenAI(api_key="sk-local", base_url=base_url, max_retries=0, timeout=120)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"{sensor_log(0, READINGS)} Acknowledge the baseline."},
    ]
    turns: list[dict[str, Any]] = []
    try:
        for batch in range(1, TURNS + 1):
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0
            )
            completion = raw.parse()
            assert raw.status_code == 200
            assert completion.usage is not None
            turns.append(
                {
                    "compaction": raw.headers.get("X-Compaction"),
                    "window": raw.headers.get("X-Compaction-Context-Window"),
                    "source": raw.headers.get("X-Compaction-Window-Source"),
                    "prompt_tokens": completion.usage.prompt_tokens,
                    "estimate": proxy_estimate(raw.headers),
                    "count": raw.headers.get("X-Compaction-Count"),
                }
            )
            messages += [
                {"role": "assistant", "content": completion.choices[0].message.content or ""},
                {"role": "user", "content": user_turn(batch, READINGS)},
            ]
    finally:
        await client.close()
    print(f"\nreal_upstream window-discovery: {json.dumps(turns)}")

    history = sum(len(llama_server.tokenize(str(message["content"]))) for message in messages)
    assert history > 2 * N_CTX, "the conversation would not have overflowed sent direct"
    assert (turns[0]["window"], turns[0]["source"]) == (str(N_CTX), "discovered")
    assert [turn["compaction"] for turn in turns].count("compacted-after-overflow") == 0
    assert any(turn["compaction"] == "compacted" for turn in turns)
    assert all(turn["prompt_tokens"] < N_CTX for turn in turns)
    # The first request is counted by the server itself; every later estimate (a request clearly under the trigger
    # is only bounded, not estimated) rests on the server's count or its usage report plus calibrated new messages.
    assert (turns[0]["count"], turns[0]["estimate"]) == ("exact", turns[0]["prompt_tokens"])
    errors = [(turn["estimate"] - turn["prompt_tokens"]) / turn["prompt_tokens"] for turn in turns if turn["estimate"]]
    assert len(errors) >= TURNS // 2
    assert max(map(abs, errors)) <= 0.02, errors


@pytest.mark.parametrize("probes", [list(DEFAULT_COUNT_PROBES), []], ids=["exact", "local"])
async def test_a_resumed_conversation_over_the_trigger_is_compacted_on_its_first_request(
    probes: list[str], proxies: Proxies
) -> None:
    """A conversation the proxy never saw arrives already past the trigger (under the window, so nothing overflows).

    With the server's count it is compacted on that first request, and the estimate is the server's own count; with
    tiktoken alone (no usage report yet to calibrate from) it is estimated about a third low and forwarded as it is.
    """
    base_url, _service = await proxies.start(
        context_windows={}, discovery_timeout=5.0, count_probes=probes, exact_count_timeout=5.0
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"{sensor_log(0, READINGS)} Acknowledge the baseline."},
    ]
    for batch in range(1, 10):
        messages += [
            {"role": "assistant", "content": f"Batch {batch - 1} noted."},
            {"role": "user", "content": user_turn(batch, READINGS)},
        ]
    client = openai.AsyncOpenAI(api_key="sk-local", base_url=base_url, max_retries=0, timeout=120)
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0
        )
    finally:
        await client.close()
    completion = raw.parse()
    assert completion.usage is not None
    prompt = completion.usage.prompt_tokens
    estimate = int(raw.headers["X-Compaction-Tokens-Before"])
    uncompacted = len(llama_cpp_prompt(proxies.upstream, messages))
    print(f"\nreal_upstream resumed ({probes}): estimate {estimate}, server {uncompacted} uncompacted, sent {prompt}")

    assert 0.7 * N_CTX < uncompacted < N_CTX, "the conversation must be over the trigger and under the window"
    if probes:
        assert raw.headers["X-Compaction-Count"] == "exact"
        assert estimate == uncompacted
        assert raw.headers["X-Compaction"] == "compacted"
        assert abs(int(raw.headers["X-Compaction-Tokens-After"]) - prompt) <= 0.02 * prompt
    else:
        assert estimate < 0.8 * uncompacted
        assert raw.headers["X-Compaction"] == "unchanged"


def llama_cpp_prompt(base_url: str, messages: list[dict[str, Any]]) -> list[int]:
    """The server's tokens for the conversation's prompt (its template applied), asked directly."""
    server = LlamaServer(base_url=base_url, n_ctx=N_CTX, log=Path("/dev/null"))
    prompt = server.post("/apply-template", {"messages": messages})["prompt"]
    return list(server.post("/tokenize", {"content": prompt, "add_special": True, "parse_special": True})["tokens"])
