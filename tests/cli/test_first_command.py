"""The README's first command, `compaction-proxy serve` with no flags, starts a healthy proxy with the defaults."""

from __future__ import annotations

import sys
from pathlib import Path

import aiohttp

from proxy import __version__
from proxy.engine.strategies.registry import DEFAULT_CHAIN
from tests.support.process_proxy import ProcessProxy


async def test_serve_with_no_flags_is_healthy_and_ready() -> None:
    script = Path(sys.executable).with_name("compaction-proxy")  # the console script `pip install` made
    # No flag, no config file, the default upstream; only the port comes from the environment (0: a free one),
    # because the default 8080 may be taken on a shared machine.
    proxy = ProcessProxy(None, command=[str(script), "serve"], port=0)
    async with proxy:
        record = await proxy.wait_for_log(lambda line: line.get("message") == "listening")
        assert record["upstream"] == "https://api.openai.com" and record["mode"] == "enforce"
        # With no settings, the Messages API goes to Anthropic and everything else to OpenAI (docs/routes.md).
        assert record["routes"] == {"anthropic": "https://api.anthropic.com", "default": "https://api.openai.com"}
        assert record["addresses"][0].startswith("127.0.0.1:")  # loopback unless asked: it forwards credentials
        assert record["version"] == __version__ and record["state_store"] == "memory"
        assert record["strategies"] == ",".join(DEFAULT_CHAIN) and record["offload"] is True
        async with aiohttp.ClientSession() as http:
            for path, expected in (("/healthz", {"status": "ok"}), ("/readyz", {"status": "ready"})):
                async with http.get(proxy.url + path) as response:
                    assert (response.status, await response.json()) == (200, expected)
        assert not [line for line in proxy.records() if line.get("level") in ("warning", "error")]
    assert proxy.returncode == 0
