"""The conversation page in a real headless Chromium, after a long compacting run of each format through the real
proxy: per request, the prompt and cached tokens it draws are the fake upstream's own usage reports, and its
compaction marks sit where the client was told `X-Compaction: compacted`, with the proxy's own figures.
"""

from __future__ import annotations

from collections import Counter
from html.parser import HTMLParser

import orjson

from tests.support.chromium import chromium_or_skip, dump_dom
from tests.support.format_agents import AGENTS, is_summary_request
from tests.support.proxies import LoopbackProxies
from tests.support.wire_formats import FormatCase, Upstream, by_format

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
    and each compaction mark's strategies, tokens before and after."""

    def __init__(self) -> None:
        super().__init__()
        self.prompt: dict[int, int] = {}
        self.parts: dict[int, dict[str, int]] = {}
        self.compactions: dict[int, tuple[list[str], int, int]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {name: str(value) for name, value in attrs}
        if "data-request" not in found:
            return
        request = int(found["data-request"])
        if tag == "rect" and "data-prompt" in found:
            self.prompt[request] = int(found["data-prompt"])
        elif tag == "rect" and "data-part" in found:
            self.parts.setdefault(request, {})[found["data-part"]] = int(found["data-tokens"])
        elif tag == "g" and "compaction" in found.get("class", ""):
            strategies = found["data-strategies"].split(",")
            self.compactions[request] = (strategies, int(found["data-before"]), int(found["data-after"]))

    def requests(self) -> list[tuple[int, int]]:
        """(prompt, cached) tokens of each request, in order."""
        return [(self.prompt[n], self.parts.get(n, {}).get("cached", 0)) for n in sorted(self.prompt)]


def upstream_counts(wire: FormatCase, upstream: Upstream, cached: list[int]) -> list[tuple[int, int]]:
    """(prompt, cached) tokens of each of the agent's requests as the upstream reported them (summary calls, which
    are the proxy's own, left out)."""
    agents = [not is_summary_request(wire, orjson.loads(body)) for body in wire.forwarded(upstream)]
    prompts = wire.upstream_prompt_tokens(upstream)
    assert len(agents) == len(prompts) == len(cached), "every forwarded request was answered with its usage"
    return [(prompt, hit) for prompt, hit, agent in zip(prompts, cached, agents, strict=True) if agent]


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
    listed = Listed()
    listed.feed(await dump_dom(root + "/conversations"))
    assert listed.ids, "the list shows the run's conversation"
    pages = []
    for conversation in reversed(listed.ids):  # oldest first, as the run went
        drawn = Drawn()
        drawn.feed(await dump_dom(f"{root}/conversation?id={conversation}"))
        pages.append(drawn)

    shown = [request for drawn in pages for request in drawn.requests()]
    assert shown == upstream_counts(wire, format_upstream, agent.cached_tokens(format_upstream))
    for drawn in pages:  # every uncached token is drawn as a miss of some cause
        assert all(sum(drawn.parts[n].values()) == drawn.prompt[n] for n in drawn.prompt)

    # The marks sit on the requests the client was told were compacted, with the proxy's own figures.
    marked, marks, offset = [], [], 0
    for drawn in pages:
        marked += [offset + n - 1 for n in sorted(drawn.compactions)]
        marks += [drawn.compactions[n] for n in sorted(drawn.compactions)]
        offset += len(drawn.prompt)
    assert marked == [turn for turn, decision in enumerate(decisions) if decision == "compacted"]
    assert sum(before for _, before, _ in marks) == proxy.metric("compaction_proxy_tokens_before_sum")
    assert sum(after for _, _, after in marks) == proxy.metric("compaction_proxy_tokens_after_sum")
    strategies = Counter(name for names, _, _ in marks for name in names)
    for name, times in strategies.items():
        assert times == proxy.metric("compaction_proxy_compactions_total", strategy=name)
