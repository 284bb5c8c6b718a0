"""The conversation page in a real headless Chromium, after a long compacting run of each format through the real
proxy: per request, the prompt and cached tokens it draws are the fake upstream's own usage reports, and its
compaction marks sit where the client was told `X-Compaction: compacted` (or `compacted-after-overflow`), with
the proxy's own figures.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from html.parser import HTMLParser
from typing import Any

import aiohttp
import openai
import orjson

from proxy.pipeline.service import CompactionPipeline
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.conftest import MODEL, WINDOW, StartProxy
from tests.support.chromium import chromium_or_skip, dump_dom
from tests.support.format_agents import AGENTS, is_summary_request
from tests.support.proxies import LoopbackProxies
from tests.support.wire_formats import CHAT_COMPLETIONS, FormatCase, Upstream, by_format

TURNS = 120
"""Long enough for every format's agent to outgrow its window more than once."""


class Listed(HTMLParser):
    """The conversations the list page shows, in its order (most recent first)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "li" and found.get("data-conversation"):
            self.ids.append(str(found["data-conversation"]))


class Drawn(HTMLParser):
    """What a conversation page draws, by request number (from 1): prompt tokens, cached tokens, misses by cause,
    and each compaction mark's strategies, tokens before and after; the bill's price and tokens by kind for each
    side (`covered`, through the proxy; `direct`), or whether it says there is no bill."""

    def __init__(self) -> None:
        super().__init__()
        self.prompt: dict[int, int] = {}
        self.parts: dict[int, dict[str, int]] = {}
        self.compactions: dict[int, tuple[list[str], int, int]] = {}
        self.bill: dict[str, dict[str, float | None]] = {}
        self.no_bill = False
        self.direct_stop: int | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {name: str(value) for name, value in attrs}
        self.no_bill = self.no_bill or (tag == "p" and found.get("class") == "placeholder")
        if tag == "rect" and "data-bill" in found:
            side = self.bill.setdefault(found["data-bill"], {})
            if "data-usd" in found:
                side["usd"] = float(found["data-usd"]) if found["data-usd"] else None
            else:
                side[found["data-kind"]] = int(found["data-tokens"])
        if "data-request" not in found:
            return
        request = int(found["data-request"])
        if tag == "rect" and "data-prompt" in found:
            self.prompt[request] = int(found["data-prompt"])
        elif tag == "rect" and "data-part" in found:
            self.parts.setdefault(request, {})[found["data-part"]] = int(found["data-tokens"])
        elif tag == "g" and found.get("class") == "direct-stop":
            self.direct_stop = request
        elif tag == "g" and "compaction" in found.get("class", ""):
            strategies = found["data-strategies"].split(",")
            self.compactions[request] = (strategies, int(found["data-before"]), int(found["data-after"]))

    def requests(self) -> list[tuple[int, int]]:
        """(prompt, cached) tokens of each request, in order."""
        return [(self.prompt[n], self.parts.get(n, {}).get("cached", 0)) for n in sorted(self.prompt)]


def reported(wire: FormatCase, body: dict[str, Any]) -> bool:
    """Whether the upstream reported the usage of a request it received: always, but for a chat stream that did not
    ask for it (a small one the proxy relays as it came: `tests/e2e/test_sized_by_bytes.py`)."""
    stream_usage = (body.get("stream_options") or {}).get("include_usage")
    return wire is not CHAT_COMPLETIONS or not body.get("stream") or bool(stream_usage)


def agent_requests(wire: FormatCase, upstream: Upstream, cached: list[int]) -> list[tuple[bool, int, int]]:
    """Each of the agent's requests the upstream answered (the proxy's summary calls left out), in order: whether
    the upstream reported its usage, and its prompt and cached tokens."""
    bodies = [orjson.loads(body) for body in wire.forwarded(upstream)]
    prompts = wire.upstream_prompt_tokens(upstream)
    assert len(bodies) == len(prompts) == len(cached), "every forwarded request was answered"
    return [
        (reported(wire, body), prompt, hit)
        for body, prompt, hit in zip(bodies, prompts, cached, strict=True)
        if not is_summary_request(wire, body)
    ]


BILL_KINDS = ("uncached_input", "cached_input", "cache_write_input", "output")


def drawn_bill(bill: dict[str, Any] | None) -> dict[str, dict[str, float | None]]:
    """What the page must draw of a conversation's `bill`: each side's price and its tokens by kind."""
    if bill is None:
        return {}
    return {
        side: {"usd": bill[side]["usd"]} | {kind: bill[side][kind] for kind in BILL_KINDS}
        for side in ("covered", "direct")
    }


async def priced_listing(root: str) -> dict[str, Any]:
    """The list's JSON once the proxy's price library is loaded (in a worker thread from start-up), so the page drawn
    after it and the JSON read after that price alike."""
    async with aiohttp.ClientSession() as http:
        while True:
            async with http.get(f"{root}/conversations.json") as got:
                listing: dict[str, Any] = await got.json()
            if listing["total"]["prices"] == "loaded":
                return listing
            await asyncio.sleep(0.05)  # polls a condition: the load takes a second or two of CPU


def direct_stop(conversation: dict[str, Any]) -> int | None:
    """The request (numbered from 1) where going direct stops: the first larger than its window, if any is."""
    first = conversation["dropped"] + 1
    records = conversation["records"]
    return next(
        (first + i for i, r in enumerate(records) if r["window"] and (r["client_tokens"] or 0) > r["window"]), None
    )


@by_format()
async def test_the_page_draws_the_upstreams_counts_and_the_compactions(
    wire: FormatCase, format_upstream: Upstream, format_proxies: LoopbackProxies
) -> None:
    chromium_or_skip()  # before the run: a missing browser is named at once, never after the run
    agent = AGENTS[wire]
    agent.install(format_upstream, summary="")
    format_upstream.context_window = agent.window
    proxy = await format_proxies.start(context_windows={wire.model: agent.window}, dashboard=True)
    decisions = await agent.run(proxy, TURNS, lambda turn: turn % 2 == 1)
    assert decisions.count("compacted") >= 2, decisions

    root = proxy.url.removesuffix("/v1") + "/dashboard"
    listing = await priced_listing(root)
    listed, total = Listed(), Drawn()
    page = await dump_dom(root + "/conversations")
    listed.feed(page)
    total.feed(page)
    assert listed.ids, "the list shows the run's conversation"
    assert total.bill == drawn_bill(listing["total"]), "the list draws the total of the conversations' bills"
    assert listing["total"]["proxy"]["requests"] == sum(
        c["bill"]["proxy"]["requests"] for c in listing["conversations"]
    )
    pages = []
    for conversation in reversed(listed.ids):  # oldest first, as the run went
        drawn = Drawn()
        drawn.feed(await dump_dom(f"{root}/conversation?id={conversation}"))
        pages.append(drawn)

    for conversation, drawn in zip(reversed(listed.ids), pages, strict=True):
        async with aiohttp.ClientSession() as http, http.get(f"{root}/conversations/{conversation}.json") as got:
            data = await got.json()
        assert data["bill"]["proxy"]["price"] == "known" and data["bill"]["proxy"]["requests"] == len(data["records"])
        assert drawn.bill == drawn_bill(data["bill"]) and not drawn.no_bill
        assert drawn.direct_stop == direct_stop(data)

    shown = [request for drawn in pages for request in drawn.requests()]
    requests = agent_requests(wire, format_upstream, agent.cached_tokens(format_upstream))
    assert len(requests) == len(decisions)
    assert shown == [(prompt, cached) for known, prompt, cached in requests if known]
    for drawn in pages:  # every uncached token is drawn as a miss of some cause
        assert all(sum(drawn.parts[n].values()) == drawn.prompt[n] for n in drawn.prompt)

    # The marks sit on the requests the client was told were compacted, with the proxy's own figures.
    marked, marks, offset = [], [], 0
    for drawn in pages:
        marked += [offset + n - 1 for n in sorted(drawn.compactions)]
        marks += [drawn.compactions[n] for n in sorted(drawn.compactions)]
        offset += len(drawn.prompt)
    told = [decision for decision, (known, _, _) in zip(decisions, requests, strict=True) if known]
    assert marked == [turn for turn, decision in enumerate(told) if decision.startswith("compacted")]
    assert sum(before for _, before, _ in marks) == proxy.metric("compaction_proxy_tokens_before_sum")
    assert sum(after for _, _, after in marks) == proxy.metric("compaction_proxy_tokens_after_sum")
    strategies = Counter(name for names, _, _ in marks for name in names)
    for name, times in strategies.items():
        assert times == proxy.metric("compaction_proxy_compactions_total", strategy=name)


async def chat(base_url: str, questions: int, **headers: str) -> None:
    """One conversation of `questions` chat requests through the proxy at `base_url`, with the official SDK."""
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are terse."}]
    async with openai.AsyncOpenAI(
        base_url=base_url, api_key="sk-test", max_retries=0, default_headers=headers
    ) as client:
        for question in range(questions):
            messages.append({"role": "user", "content": f"Question {question}: what failed?"})
            completion = await client.chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
            messages.append({"role": "assistant", "content": completion.choices[0].message.content or ""})


async def test_a_browser_given_the_key_as_its_password_sees_the_conversations(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    key = "browser-key-0123456789"
    base_url = await start_proxy(dashboard=True, proxy_keys=[key])
    await chat(base_url, 2, **{"X-Proxy-Key": key})
    root = base_url.removesuffix("/v1") + "/dashboard"
    refused, listed = Listed(), Listed()
    refused.feed(await dump_dom(root + "/conversations"))
    assert refused.ids == []  # without the key: the 401, no conversations
    keyed = root.replace("http://", "http://anyone:" + key + "@")
    listed.feed(await dump_dom(keyed + "/conversations"))
    assert len(listed.ids) == 1
    drawn = Drawn()
    drawn.feed(await dump_dom(f"{keyed}/conversation?id={listed.ids[0]}"))
    assert drawn.requests() == [(usage["prompt_tokens"], 0) for usage in upstream.usages]


async def test_past_the_records_kept_the_page_numbers_requests_from_the_first_kept(upstream: OpenAIUpstream) -> None:
    proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={MODEL: WINDOW})
    try:
        proxy = await proxies.start(dashboard=True)
        assert isinstance(proxy.service, CompactionPipeline)
        proxy.service.ledger.max_requests = 3
        await chat(proxy.url, 5)
        root = proxy.url.removesuffix("/v1") + "/dashboard"
        listed, drawn = Listed(), Drawn()
        listed.feed(await dump_dom(root + "/conversations"))
        drawn.feed(await dump_dom(f"{root}/conversation?id={listed.ids[0]}"))
    finally:
        await proxies.close()
    assert sorted(drawn.prompt) == [3, 4, 5]
    assert drawn.requests() == [(usage["prompt_tokens"], 0) for usage in upstream.usages[2:]]
