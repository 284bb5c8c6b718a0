"""`tool_result_offloading` named in `strategies` places offloading in the chain, in `serve` and `compact` alike."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import orjson
import pytest

from proxy.config import ConfigError, load_settings
from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.conftest import StartProxy
from tests.e2e.test_one_decision import tool_conversation
from tests.support.chat_requests import post

WINDOW = 8192


async def compacted(upstream: OpenAIUpstream, start_proxy: StartProxy, strategies: list[str]) -> dict[str, str]:
    """The decision headers of a tool loop sent through a proxy running `strategies`."""
    upstream.context_window = WINDOW
    base_url = await start_proxy(strategies=strategies)
    status, headers, _ = await post(base_url, tool_conversation(30), **{"X-Context-Window": str(WINDOW)})
    assert status == 200 and headers["X-Compaction"] == "compacted"
    return dict(headers)


async def test_offloading_runs_where_it_is_named(upstream: OpenAIUpstream, start_proxy: StartProxy) -> None:
    headers = await compacted(upstream, start_proxy, ["json_minify", "tool_result_offloading"])
    assert headers["X-Compaction-Strategies"].split(",")[-1] == "tool_result_offloading"
    assert int(headers["X-Compaction-Offloaded"]) > 0


async def test_offloading_named_after_pruning_runs_after_it(upstream: OpenAIUpstream, start_proxy: StartProxy) -> None:
    # Pruning first reaches the target on its own: offloading, placed after it, has nothing left to do.
    headers = await compacted(upstream, start_proxy, ["tool_result_pruning", "tool_result_offloading"])
    assert headers["X-Compaction-Strategies"] == "tool_result_pruning"
    assert "X-Compaction-Offloaded" not in headers
    # Unnamed, offloading goes before the first lossy step, as by default.
    headers = await compacted(upstream, start_proxy, ["tool_result_pruning"])
    assert headers["X-Compaction-Strategies"].split(",")[0] == "tool_result_offloading"


async def test_compact_takes_the_named_step(upstream: OpenAIUpstream, start_proxy: StartProxy) -> None:
    headers = await compacted(upstream, start_proxy, ["json_minify", "tool_result_offloading"])
    command = [
        *(sys.executable, "-m", "proxy.cli", "compact", "-", "--context-window", str(WINDOW)),
        *("--strategies", "json_minify,tool_result_offloading"),
    ]
    body = tool_conversation(30)
    printed = await asyncio.to_thread(subprocess.run, command, input=body, capture_output=True, timeout=120, check=True)
    assert orjson.loads(printed.stdout) == orjson.loads(upstream.requests[-1].body)
    assert headers["X-Compaction-Strategies"].replace(",", ", ").encode() in printed.stderr


def test_offloading_named_with_offload_off_is_refused() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(
            environ={"COMPACTION_PROXY_STRATEGIES": "tool_result_offloading", "COMPACTION_PROXY_OFFLOAD": "0"}
        )
    assert "names tool_result_offloading but offload is off" in str(caught.value)
