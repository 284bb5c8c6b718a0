"""The dashboard screenshot of docs/using.md: a proxy in front of the fake upstream, a few minutes of traffic, Chromium.

Each minute sends the run of `tests.e2e.dashboard_traffic` (more agent tasks in some minutes than in others) through
a proxy with `dashboard` on, in real time: the proxy's own ring samples its metrics once a minute, as in production.
Then headless Chromium renders `/dashboard` to a PNG once the page has drawn its figures (never "Loading the
figures…").

`python -m bench.dashboard_screenshot deploy/docs/dashboard.png` (about `--minutes` + 1 minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from proxy.server.metric_ring import STEP_SECONDS
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.conftest import MODEL, WINDOW
from tests.e2e.dashboard_traffic import exercise
from tests.support.chromium import screenshot
from tests.support.proxies import LoopbackProxies

TASKS = (1, 3, 2, 4, 1, 2, 3, 2)
"""Agent tasks per minute, in turn."""


async def main(path: Path, minutes: int) -> None:
    """Run `minutes` minutes of traffic and one more run, then write the screenshot to `path` (absolute)."""
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
            await screenshot(page, path, ready="document.body.dataset.loaded === 'true'", height=1320)
        finally:
            await proxies.close()
    print(path)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--minutes", type=int, default=6)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.path.resolve(), arguments.minutes))
