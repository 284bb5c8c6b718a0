"""Real proxies on loopback ports for end-to-end tests: the aiohttp app with the real compaction service."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from proxy.config import Settings
from proxy.engine import CompactionChain
from proxy.pipeline.routed import RoutedPipelines, build_pipeline
from proxy.pipeline.service import CompactionPipeline
from proxy.server import create_app
from proxy.server.keys import METRICS


@dataclass(frozen=True)
class RunningProxy:
    """A started proxy: its settings, its compaction service and its OpenAI base URL (`.../v1`).

    The service is one pipeline, or one per route when the settings name several upstreams (`build_pipeline`).
    """

    settings: Settings
    service: CompactionPipeline | RoutedPipelines
    server: TestServer

    @property
    def url(self) -> str:
        """The base URL an OpenAI client is given."""
        return f"http://127.0.0.1:{self.server.port}/v1"

    async def exposition(self) -> str:
        """What `GET /metrics` serves, fetched over the proxy's socket."""
        async with aiohttp.ClientSession() as http, http.get(self.url.removesuffix("/v1") + "/metrics") as response:
            return await response.text()

    def metric(self, name: str, **labels: str) -> float:
        """One sample of what `/metrics` serves (0 for a labelled counter never counted)."""
        value = self.server.app[METRICS].registry.get_sample_value(name, labels or None)
        return value or 0.0


class LoopbackProxies:
    """Starts proxies in front of their upstreams, each with `defaults` under its own settings, and closes them all.

    Window probes and exact counts are off unless `defaults` or a proxy's settings turn them on, so the upstream sees
    only what the test sends.
    """

    def __init__(self, **defaults: Any) -> None:
        self.defaults = {"window_probes": [], "count_probes": [], **defaults}
        self._servers: list[TestServer] = []

    async def start(
        self, chain: CompactionChain | None = None, *, clock: Callable[[], float] | None = None, **settings: Any
    ) -> RunningProxy:
        """A proxy with the default settings updated by `settings`.

        :param chain: The compaction chain its pipeline runs, instead of the one `strategies` names (a benchmark's
            baseline strategies, which the registry does not know).
        :param clock: What its ledger times requests by (see `create_app`), instead of the wall clock.
        """
        values = {**self.defaults, **settings}
        configured = Settings(**values)
        service = build_pipeline(configured) if chain is None else CompactionPipeline(configured, chain=chain)
        server = TestServer(create_app(configured, service, clock=clock), host="127.0.0.1", port=0)
        await server.start_server()
        self._servers.append(server)
        return RunningProxy(configured, service, server)

    async def close(self) -> None:
        """Stop every proxy started."""
        for server in self._servers:
            await server.close()
