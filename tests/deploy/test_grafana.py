"""The Grafana board is one JSON file the chart ships and deploy/grafana links to, and every panel explains itself."""

from __future__ import annotations

import json
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
BOARD = DEPLOY / "grafana" / "compaction-proxy.json"
CHART_COPY = DEPLOY / "helm" / "compaction-proxy" / "dashboards" / "compaction-proxy.json"


def test_deploy_grafana_is_the_charts_file_not_a_copy() -> None:
    assert BOARD.is_symlink() and BOARD.resolve() == CHART_COPY.resolve()


def test_every_panel_queries_the_chosen_prometheus_says_what_it_shows_and_fits_the_grid() -> None:
    board = json.loads(BOARD.read_text())
    assert [variable["name"] for variable in board["templating"]["list"]] == ["datasource"]
    panels = board["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    occupied: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel["description"].strip(), panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"] and all(target["expr"] for target in panel["targets"])
        # A share names its denominator ("a / b"); anything else says it divides by nothing.
        assert " / " in panel["description"] or "Divides by nothing" in panel["description"], panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24
        columns, rows = range(grid["x"], grid["x"] + grid["w"]), range(grid["y"], grid["y"] + grid["h"])
        cells = {(x, y) for x in columns for y in rows}
        assert not cells & occupied, f"{panel['title']} overlaps another panel"
        occupied |= cells
