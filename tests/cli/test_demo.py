"""`compaction-proxy demo`: an agent outgrows the simulated model's window through the proxy, in every format.

The run is the demo's own (`proxy.demo.session.run`, the proxy the same app `serve` runs), read from what it prints:
the proxy keeps every request the model is sent inside the window, compacting it, while the client's history, sent
direct, would not fit by the turn the demo names.
"""

from __future__ import annotations

import io
import re

import pytest

from proxy.config import Settings
from proxy.demo.session import Plan, run

WINDOW = 8000
TURN = re.compile(r"^\s*(\d+)  \[[#.]+\]\s+([\d,]+)/([\d,]+)\s+(\d+%|-)\s+(\S+)(?: ([\d,]+) -> ([\d,]+) tokens)?")


def number(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.mark.parametrize("wire_format", ["chat", "responses", "messages"])
async def test_the_proxy_keeps_the_agent_inside_the_window_going_direct_would_leave(wire_format: str) -> None:
    out = io.StringIO()
    await run(Plan(Settings(port=0), WINDOW, turns=30, wire_format=wire_format, wait=False), out)
    lines = out.getvalue().splitlines()
    turns = [match.groups() for match in map(TURN.match, lines) if match]
    assert [int(turn[0]) for turn in turns] == list(range(1, 31))
    assert all(number(sent) <= WINDOW and number(window) == WINDOW for _, sent, window, *_ in turns)
    compacted = [turn for turn in turns if turn[4] == "compacted"]
    assert len(compacted) >= 2
    assert all(number(before) > number(after) for *_, before, after in compacted)
    assert all(turn[4] == "unchanged" for turn in turns if turn not in compacted)
    (overflow,) = [line for line in lines if line.startswith("Going direct, turn ")]
    overflow_turn = int(overflow.split()[3])
    assert overflow_turn > int(compacted[0][0])  # the proxy compacted before going direct would have failed
    marked = lines.index(next(line for line in lines if line.lstrip().startswith(f"{overflow_turn}  [")))
    assert "over the window" in lines[marked + 1]
    summary = re.fullmatch(r"30 turns, \d+ compacted; the largest request [\d,]+ tokens of 8,000; (\d+)% .*", lines[-2])
    assert summary is not None and int(summary.group(1)) >= 50  # compaction keeps most of the prompt cache
