"""The Grafana board names only metrics the proxy exports: each has a series on a running proxy's `/metrics`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp

from proxy.simulator.openai_upstream import OpenAIUpstream
from tests.e2e.conftest import StartProxy
from tests.e2e.dashboard_traffic import exercise
from tests.support.exported_metrics import declared_names, sampled_names

BOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "compaction-proxy.json"
METRIC = re.compile(r"\bcompaction_proxy_[a-z_]+\b")

FAILURE_ONLY = {"compaction_proxy_fail_open_total": "stage", "compaction_proxy_summary_fallbacks_total": "reason"}
"""Labelled counters whose first series comes with a failure (the compaction side failing, a summary not written):
the board plots them from the first failure on; here they must be declared, with the label the board groups by."""


def board_metrics() -> set[str]:
    board = json.loads(BOARD.read_text())
    return {name for panel in board["panels"] for target in panel["targets"] for name in METRIC.findall(target["expr"])}


async def test_every_metric_the_board_names_has_a_series_after_a_run(
    upstream: OpenAIUpstream, start_proxy: StartProxy
) -> None:
    base_url = await start_proxy()
    await exercise(base_url, upstream)
    async with aiohttp.ClientSession() as http, http.get(base_url.removesuffix("/v1") + "/metrics") as response:
        exposition = await response.text()
    # The retried overflow counts as what its answer said (`X-Compaction: compacted-after-overflow`).
    assert 'compaction_proxy_decisions_total{decision="compacted-after-overflow",route="chat_completions"} 1.0' in (
        exposition
    )
    assert 'compaction_proxy_window_sources_total{source="learned"}' in exposition
    named = board_metrics()
    assert len(named) >= 20
    assert named <= declared_names(exposition), named - declared_names(exposition)
    missing = named - sampled_names(exposition)
    assert missing == set(FAILURE_ONLY) & named, missing
    for name, label in FAILURE_ONLY.items():
        assert f"# HELP {name} " in exposition and label in exposition.split(f"# HELP {name} ")[1].split("\n")[0]
