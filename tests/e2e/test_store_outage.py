"""A state store that does not answer: every request is forwarded unchanged, one WARNING for the outage, all counted."""

from __future__ import annotations

import logging
import socket

import aiohttp
import pytest

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.conftest import StartProxy
from tests.support.chat_requests import history, post

REQUESTS = 6


def unused_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_state_store_outage_is_one_warning_and_counted_fail_opens(
    upstream: OpenAIUpstream, start_proxy: StartProxy, caplog: pytest.LogCaptureFixture
) -> None:
    upstream.context_window = 1_000_000
    url = f"redis://127.0.0.1:{unused_port()}/0"
    base_url = await start_proxy(state_url=url, tenant_key="t" * 32)
    caplog.set_level(logging.INFO)
    caplog.clear()

    for turn in range(REQUESTS):
        body = history(30 + turn)
        status, headers, _ = await post(base_url, body)
        assert status == 200
        assert headers["X-Compaction"] == "error"
        assert upstream.requests[-1].body == body

    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
    outage = [record for record in caplog.records if "does not answer" in record.getMessage()]
    assert len(outage) == 1 and outage[0].levelno == logging.WARNING
    async with aiohttp.ClientSession() as http, http.get(base_url.removesuffix("/v1") + "/metrics") as response:
        metrics = await response.text()
    assert f'compaction_proxy_fail_open_total{{stage="compact"}} {float(REQUESTS)}' in metrics
