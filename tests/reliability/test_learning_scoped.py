"""What the proxy learns is scoped and checked: no caller, and no single upstream answer, changes other conversations.

Issue 14: a context window learned from an error was global per model and read from free text (an upstream 400
quoting the caller's own words set the window of every tenant); one usage report of 10^15 tokens truncated a
conversation for good; an `X-Context-Window` sent once was remembered; and two proxy keys without a provider
credential shared conversation state. Each test here drives the real proxy on loopback in front of the OpenAI-like
upstream and observes only what a client and the provider see: response headers and the forwarded messages.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from proxy.simulator.openai_upstream import OpenAIUpstream, context_length_error
from tests.reliability.conftest import MESSAGES, MODEL, MakeProxy, Proxy, chat_body, post_chat

MODEL_WINDOW = "128000"
"""The shipped window of `MODEL` (gpt-4o-mini): what `X-Compaction-Context-Window` says when nothing overrides it."""

STATED_WINDOW = 120
"""The window the hostile or misleading error answers state: far below what the conversations need."""

TENANT_A = {"Authorization": "Bearer sk-a"}
TENANT_B = {"Authorization": "Bearer sk-b"}

QUOTED_OVERFLOW = {
    "error": {
        "message": f"Invalid value: 'This model's maximum context length is {STATED_WINDOW} tokens'",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "invalid_value",
    }
}
"""An upstream 400 that quotes the caller's own text: it only looks like an overflow."""

GENUINE_OVERFLOW = context_length_error(STATED_WINDOW, 300, 0).body
"""OpenAI's own `context_length_exceeded` answer, stating a window of `STATED_WINDOW` tokens."""


def conversation(marker: str, messages: int = 42) -> list[dict[str, Any]]:
    """`messages` messages (system, then user and assistant turns, a user message last): ~15 tokens each."""
    built: list[dict[str, Any]] = [{"role": "system", "content": f"You answer questions about {marker}."}]
    for turn in range(messages - 2):
        role = "user" if turn % 2 == 0 else "assistant"
        built.append({"role": role, "content": f"Turn {turn} about {marker}: the queue drained after the deploy."})
    built.append({"role": "user", "content": f"What happened to {marker} in the end?"})
    return built


def next_turn(messages: list[dict[str, Any]], answer: bytes, question: str) -> list[dict[str, Any]]:
    """The conversation a client sends next: its history, the reply it got, and a new question."""
    reply = json.loads(answer)["choices"][0]["message"]
    return [*messages, reply, {"role": "user", "content": question}]


async def send(
    http: aiohttp.ClientSession, proxy: Proxy, messages: list[dict[str, Any]], **headers: str
) -> tuple[int, CIMultiDict[str], bytes]:
    return await post_chat(http, proxy, chat_body(messages=messages), **headers)


def assert_forwarded_whole(
    upstream: OpenAIUpstream, headers: CIMultiDict[str], messages: list[dict[str, Any]], window: str = MODEL_WINDOW
) -> None:
    """The upstream received exactly `messages`, and the proxy said it left them alone under `window`."""
    assert upstream.chat_requests[-1]["messages"] == messages
    assert headers["X-Compaction"] == "unchanged"
    assert headers["X-Compaction-Context-Window"] == window


# ---- windows learned from errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error", [QUOTED_OVERFLOW, GENUINE_OVERFLOW], ids=["error-quoting-caller-text", "genuine-overflow"]
)
async def test_an_overflow_answer_for_one_tenant_leaves_other_tenants_windows(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession, error: dict[str, Any]
) -> None:
    upstream.fail_next(400, error)
    status, _, _ = await send(http, proxy, MESSAGES, **TENANT_A)
    assert status in (200, 400)  # relayed as is, or retried: either way nothing of it reaches tenant B
    others = conversation("billing")
    status, headers, _ = await send(http, proxy, others, **TENANT_B)
    assert status == 200
    assert_forwarded_whole(upstream, headers, others)


async def test_a_stated_window_below_what_usage_showed_to_fit_is_not_learned(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession
) -> None:
    fitted = conversation("billing")
    status, _, _ = await send(http, proxy, fitted, **TENANT_A)
    assert status == 200
    assert upstream.usages[-1]["prompt_tokens"] > 4 * STATED_WINDOW  # the provider showed it fits, for tenant A
    upstream.fail_next(400, GENUINE_OVERFLOW)
    await send(http, proxy, MESSAGES, **TENANT_A)
    later = conversation("shipping")
    status, headers, _ = await send(http, proxy, later, **TENANT_A)
    assert status == 200
    assert_forwarded_whole(upstream, headers, later)


# ---- usage reports and per-request overrides -----------------------------------------------------------------------


async def test_an_absurd_usage_report_truncates_nothing(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession
) -> None:
    messages = conversation("billing")
    upstream.misreport_usage_next(prompt_tokens=10**15, total_tokens=10**15 + 5)
    status, _, answer = await send(http, proxy, messages, **TENANT_A)
    assert status == 200
    for question in ("And then?", "Why?"):
        messages = next_turn(messages, answer, question)
        status, headers, answer = await send(http, proxy, messages, **TENANT_A)
        assert status == 200
        assert_forwarded_whole(upstream, headers, messages)


async def test_a_per_request_window_is_not_remembered(
    upstream: OpenAIUpstream, proxy: Proxy, http: aiohttp.ClientSession
) -> None:
    messages = conversation("billing")
    _, headers, _ = await send(http, proxy, messages, **TENANT_A, **{"X-Context-Window": "300"})
    assert headers["X-Compaction"] == "compacted"  # the override applied to that request, whatever came out
    for question in ("And then?", "Why?"):
        messages = [*messages, {"role": "assistant", "content": "It drained."}, {"role": "user", "content": question}]
        status, headers, _ = await send(http, proxy, messages, **TENANT_A)
        assert status == 200
        assert_forwarded_whole(upstream, headers, messages)


# ---- proxy keys as tenants ------------------------------------------------------------------------------------------

PROXY_KEYS = ["proxykey-alice-7c6b5a4d3e2f", "proxykey-bob-0a1b2c3d4e5f6"]
ALICE = {"X-Proxy-Key": PROXY_KEYS[0], "Authorization": ""}
BOB = {"X-Proxy-Key": PROXY_KEYS[1], "Authorization": ""}
"""Holders of two proxy keys, sending no provider credential (the upstream needs none)."""


async def test_proxy_keys_do_not_share_anchors(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    # Over the trigger in bytes, under it in tokens: estimated by counting, never sized by its bytes alone.
    proxy = await make_proxy(upstream.base_url, proxy_keys=PROXY_KEYS, context_windows={MODEL: 2000})
    first = conversation("billing")
    status, _, answer = await send(http, proxy, first, **ALICE)
    assert status == 200
    second = next_turn(first, answer, "And then?")
    # Both probes fail upstream, so neither leaves an anchor of its own: each estimate shows only what was there.
    upstream.fail_next(500, times=2)
    # Alice's next turn is estimated from the usage the provider reported for her first (her anchor)...
    _, alice, _ = await send(http, proxy, second, **ALICE)
    # ...Bob, sending the very same messages, has no anchor: his estimate rests on local counts (or their bound).
    _, bob, _ = await send(http, proxy, second, **BOB)
    assert alice["X-Compaction-Tokens-Before"] != bob["X-Compaction-Tokens-Before"]


async def test_proxy_keys_do_not_share_rewrites(
    upstream: OpenAIUpstream, make_proxy: MakeProxy, http: aiohttp.ClientSession
) -> None:
    proxy = await make_proxy(upstream.base_url, proxy_keys=PROXY_KEYS, context_windows={MODEL: 1000})
    messages = conversation("billing", messages=120)
    status, alice, answer = await send(http, proxy, messages, **ALICE)
    assert status == 200 and alice["X-Compaction"] == "compacted"
    # Bob extends Alice's conversation: with her rewrite replayed he would be under the trigger; his own is not.
    extended = next_turn(messages, answer, "And then?")
    status, bob, _ = await send(http, proxy, extended, **BOB)
    assert status == 200 and bob["X-Compaction"] == "compacted"
