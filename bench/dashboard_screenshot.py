"""The dashboard screenshot of docs/using.md: a proxy in front of the fake upstream, a few minutes of traffic, Chromium.

Each minute sends the run of `tests.e2e.dashboard_traffic` (more agent tasks in some minutes than in others) through
a proxy with `dashboard` on, in real time: the proxy's own ring samples its metrics once a minute, as in production.
Then headless Chromium renders `/dashboard` to a PNG once the page has drawn its figures (never "Loading the
figures…").

With `--conversation PATH`, the same proxy then carries a long compacting run of the chat agent
(`tests.support.format_agents`), and Chromium renders that conversation's page (`/dashboard/conversation?id=...`) to
a second PNG: the screenshot of docs/cost.md.

`python -m bench.dashboard_screenshot deploy/docs/dashboard.png --conversation deploy/docs/conversation.png` (about
`--minutes` + 1 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import aiohttp

from proxy.server.metric_ring import STEP_SECONDS
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.conftest import MODEL, WINDOW
from tests.e2e.dashboard_traffic import exercise
from tests.support.agent_run import SUMMARY_TEXT
from tests.support.chromium import screenshot
from tests.support.format_agents import AGENTS
from tests.support.proxies import LoopbackProxies, RunningProxy
from tests.support.wire_formats import CHAT_COMPLETIONS

TASKS = (1, 3, 2, 4, 1, 2, 3, 2)
"""Agent tasks per minute, in turn."""

TURNS = 90
"""The conversation page's run: the chat agent outgrows its window a few times in it."""

READY = "document.body.dataset.loaded === 'true'"
"""Both pages set it once they have drawn their data."""


async def conversation_screenshot(proxy: RunningProxy, upstream: OpenAIUpstream, path: Path) -> None:
    """Run the chat agent for `TURNS` turns through `proxy` and write its conversation's page to `path`."""
    agent = AGENTS[CHAT_COMPLETIONS]
    agent.install(upstream, summary=SUMMARY_TEXT)
    await agent.run(proxy, TURNS, lambda turn: turn % 2 == 1)
    root = proxy.url.removesuffix("/v1") + "/dashboard"
    async with aiohttp.ClientSession() as http:
        async with http.get(root + "/conversations.json") as listed:
            conversations = (await listed.json())["conversations"]
        longest = max(conversations, key=lambda conversation: conversation["requests"])["id"]
        async with http.get(f"{root}/conversations/{longest}.json") as one:
            billed = "bill" in await one.json()
    # The bill's plot, where the data has one, takes the page down by 280 pixels.
    await screenshot(f"{root}/conversation?id={longest}", path, ready=READY, height=1520 if billed else 1240)


async def main(path: Path, minutes: int, conversation: Path | None = None) -> None:
    """Run `minutes` minutes of traffic and one more run, then write the screenshot to `path` (absolute), and the
    conversation page's to `conversation` (absolute) when given."""
    async with OpenAIUpstream(context_window=WINDOW) as upstream:
        proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={MODEL: WINDOW})
        try:
            started = time.monotonic()
            proxy = await proxies.start(dashboard=True)
            for minute in range(minutes + 1):
                await exercise(proxy.url, upstream, tasks=TASKS[minute % len(TASKS)], key=f"sk-minute-{minute}")
                if minute < minutes:
                    await asyncio.sleep(max(0.0, started + (minute + 1) * STEP_SECONDS + 1 - time.monotonic()))
            page = proxy.url.removesuffix("/v1") + "/dashboard"
            await screenshot(page, path, ready=READY, height=1320)
            if conversation is not None:
                await conversation_screenshot(proxy, upstream, conversation)
        finally:
            await proxies.close()
    print(path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--minutes", type=int, default=6)
    parser.add_argument("--conversation", type=Path, help="also write a long run's conversation page here")
    arguments = parser.parse_args()
    conversation = arguments.conversation.resolve() if arguments.conversation else None
    asyncio.run(main(arguments.path.resolve(), arguments.minutes, conversation))
