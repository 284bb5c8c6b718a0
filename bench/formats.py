"""`python -m bench.formats [--quick]`: the small conversation's sequential cell as a chat completion and as a
Messages API request, side by side in one run against the same processes.

The whole benchmark (`bench.run`) measures the Messages API row long after the chat rows, on a machine whose load
changes between them; this measures both rows round by round, so the two `proxy vs relay` ratios compare. Each of
the 3 rounds runs both rows in turn, and each figure is the median over the rounds. `--quick` sends a few hundred
requests a cell instead of 3000 (`--requests` sets them): the p50 ratios hold, the p99s are noise.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.latency import Load, Target, median_summary, run_cell, write_progress
from bench.payloads import build, build_messages
from bench.report import latency_table
from bench.run import FULL, MESSAGES_API, MESSAGES_TARGETS, servers, summarize_latency

QUICK_REQUESTS = 500
"""Requests a cell sends under `--quick`: enough for a stable median on a busy machine, in a few seconds."""


def measure(rounds: int, requests: int, max_seconds: float) -> list[dict[str, Any]]:
    """The summarized chat and Messages rows (`bench.run.summarize_latency`), each round both rows in turn."""
    tokens = FULL.sizes["small"]
    with tempfile.TemporaryDirectory(prefix="compaction-bench-formats-") as temp:
        workdir = Path(temp)
        chat = build("small", tokens, workdir)
        messages = build_messages(MESSAGES_API, tokens, workdir)
        with servers(workdir, chat.bytes_per_token) as procs:
            cells = []
            load = Load(1, requests, warmup=min(50, requests // 10), max_seconds=max_seconds)
            anthropic = {"anthropic-version": "2023-06-01"}
            for round_number in range(rounds):
                write_progress(f"round {round_number + 1} of {rounds}: chat, then Messages, {requests} requests")
                cells += run_cell([Target(name, procs[key].url) for name, key in MESSAGES_TARGETS], chat, load, 1)
                targets = [Target(name, procs[key].url, anthropic) for name, key in MESSAGES_TARGETS]
                cells += run_cell(targets, messages, load, 1)
    return summarize_latency(_medians(cells))


def _medians(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One cell per (payload, target): the medians over its rounds (`bench.latency.median_summary`)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for cell in cells:
        groups.setdefault((cell["payload"], cell["target"]), []).append(cell)
    return [median_summary(group) for group in groups.values()]


def main(argv: list[str] | None = None) -> int:
    """Measure, print the two rows of the latency table and each row's proxy-vs-relay ratio."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_REQUESTS} requests a cell")
    parser.add_argument("--requests", type=int, help="requests a cell sends (default: the plan's)")
    args = parser.parse_args(argv)
    requests = args.requests or (QUICK_REQUESTS if args.quick else FULL.requests["small"][1])
    started = time.perf_counter()
    rows = measure(FULL.rounds, requests, FULL.max_seconds)
    print(f"`python -m bench.formats{' --quick' * args.quick}`: {time.perf_counter() - started:.0f} s")
    print("\n".join(latency_table(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
