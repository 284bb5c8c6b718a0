"""The dashboard in a real headless Chromium, after a compacting run through the real proxy: it shows the run.

The run goes through the official SDK (chat completions and responses); what the client was told (headers, usage)
is what the rendered page must show, number for number.
"""

from __future__ import annotations

from collections import Counter
from html.parser import HTMLParser
from typing import Any

import aiohttp
import openai

from tests.e2e.conftest import MODEL, StartProxy
from tests.e2e.test_offload_reads import CLIENT_TOOLS, conversation
from tests.support.agent_run import TOOLS, agent_responder, run_agent
from tests.support.chromium import chromium_or_skip, dump_dom
from tests.support.openai_upstream import OpenAIUpstream
from tests.support.reading_model import reading_chat_responder


class Shown(HTMLParser):
    """The figures a rendered dashboard shows: {figure id: {item id: data-value}} and each figure's series names."""

    def __init__(self) -> None:
        super().__init__()
        self.items: dict[str, dict[str, str]] = {}
        self.series: dict[str, list[str]] = {}
        self.divides_by: dict[str, str] = {}
        self._figure = ""
        self._item = ""
        self._divides = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "section" and found.get("data-figure"):
            self._figure = str(found["data-figure"])
            self.items[self._figure], self.series[self._figure] = {}, []
        elif tag == "div" and found.get("data-item"):
            self._item = str(found["data-item"])
        elif tag == "dd" and "data-value" in found:
            self.items[self._figure][self._item] = str(found["data-value"])
        elif tag == "li" and found.get("data-series"):
            self.series[self._figure].append(str(found["data-series"]))
        self._divides = tag == "p" and found.get("class") == "divides"

    def handle_data(self, data: str) -> None:
        if self._divides and data.startswith("Divides by: "):
            self.divides_by[self._figure] = data.removeprefix("Divides by: ")


def number(shown: Shown, figure: str, item: str) -> float:
    return float(shown.items[figure][item])


async def test_the_rendered_dashboard_shows_the_runs_figures(upstream: OpenAIUpstream, start_proxy: StartProxy) -> None:
    chromium_or_skip()  # before the run: a missing browser is named at once, never after a minute of work
    upstream.responder = agent_responder()
    base_url = await start_proxy(dashboard=True)
    told: list[dict[str, str]] = []
    prompt = cached = 0

    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0) as client:

        async def turn(messages: list[dict[str, Any]]) -> tuple[dict[str, Any], str]:
            nonlocal prompt, cached
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=messages,  # type: ignore[arg-type]
                tools=TOOLS,  # type: ignore[arg-type]
            )
            completion = raw.parse()
            told.append(dict(raw.headers))
            assert completion.usage is not None and completion.usage.prompt_tokens_details is not None
            prompt += completion.usage.prompt_tokens
            cached += completion.usage.prompt_tokens_details.cached_tokens or 0
            return completion.choices[0].message.model_dump(exclude_none=True), raw.headers.get("x-compaction", "")

        await run_agent(turn, tasks=4, steps=12)
        responses = 3
        for question in range(responses):
            response = await client.responses.create(model=MODEL, input=f"Question {question}: what changed?")
            assert response.usage is not None
            prompt += response.usage.input_tokens
            cached += response.usage.input_tokens_details.cached_tokens

    compacted = [headers for headers in told if headers["x-compaction"] == "compacted"]
    assert compacted, "the run must compact for the dashboard to show compactions"
    tokens_before = sum(int(headers["x-compaction-tokens-before"]) for headers in compacted)
    tokens_after = sum(int(headers["x-compaction-tokens-after"]) for headers in compacted)

    shown = Shown()
    shown.feed(await dump_dom(base_url.removesuffix("/v1") + "/dashboard"))

    assert number(shown, "requests", "chat_completions") == len(told)
    assert number(shown, "requests", "responses") == responses
    assert number(shown, "decisions", "seen_chat_completions") == len(told)
    assert number(shown, "decisions", "seen_responses") == responses
    assert number(shown, "decisions", "compacted") == len(compacted)
    assert number(shown, "tokens", "compactions") == len(compacted)
    assert number(shown, "tokens", "before") == tokens_before
    assert number(shown, "tokens", "after") == tokens_after
    # As the figure says, removed / before: `1 - after / before` can differ from it in the last bit.
    assert 0 < number(shown, "tokens", "removed_share") == (tokens_before - tokens_after) / tokens_before
    assert number(shown, "cache", "prompt") == prompt
    assert cached > 0 and number(shown, "cache", "cached") == cached
    assert number(shown, "cache", "cached_share") == cached / prompt
    assert number(shown, "windows", "known") == len(told) + responses
    assert number(shown, "fail_open", "fail_open") == 0
    strategies = Counter(name for headers in compacted for name in headers["x-compaction-strategies"].split(","))
    assert {name: number(shown, "strategies", name) for name in shown.items["strategies"]} == strategies
    # Every figure says what it divides by.
    assert set(shown.divides_by) == set(shown.items) and all(shown.divides_by.values())


async def test_every_round_of_a_read_counts_its_prompt_tokens_as_the_client_is_billed(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    upstream.responder = reading_chat_responder
    base_url = await start_proxy(dashboard=True)
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0) as client:
        completion = await client.chat.completions.create(
            model=MODEL,
            messages=conversation(),  # type: ignore[arg-type]
            tools=CLIENT_TOOLS,  # type: ignore[arg-type]
        )
    assert completion.usage is not None and len(upstream.usages) == 2  # the question, then the answer after the read
    async with aiohttp.ClientSession() as http, http.get(base_url.removesuffix("/v1") + "/dashboard.json") as got:
        figures = {figure["id"]: figure for figure in (await got.json())["figures"]}
    items = {item["id"]: item["value"] for item in figures["cache"]["items"]}
    assert items["prompt"] == completion.usage.prompt_tokens == sum(usage["prompt_tokens"] for usage in upstream.usages)
    offload = {item["id"]: item["value"] for item in figures["offload"]["items"]}
    assert offload["offloaded"] == offload["served"] == 1


async def test_a_browser_given_the_key_as_its_password_sees_the_figures(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    key = "browser-key-0123456789"
    base_url = await start_proxy(dashboard=True, proxy_keys=[key])
    async with openai.AsyncOpenAI(
        base_url=base_url, api_key="sk-test", max_retries=0, default_headers={"X-Proxy-Key": key}
    ) as client:
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello"}])
    page = base_url.removesuffix("/v1") + "/dashboard"
    refused, shown = Shown(), Shown()
    refused.feed(await dump_dom(page))
    assert refused.items == {}  # without the key: the 401, no figures
    shown.feed(await dump_dom(page.replace("http://", "http://anyone:" + key + "@")))
    assert number(shown, "requests", "chat_completions") == 1
