"""The proxy's fixed cost against the bare relay's, on each event loop: small requests and paced streamed events.

For each loop installed (asyncio's, and uvloop's when the `speed` extra is), a relay and a proxy on that loop, in
front of one instant upstream, get the same loads side by side, in rounds that rotate their order:

- the small conversation, 32 clients at once and one client: requests per second, proxy / relay;
- streamed answers paced like a model's tokens (`STREAMS` streams of `EVENTS` content events `PACE` seconds apart,
  `STREAMED_CLIENTS` at once): the server process's CPU time (user + system, from /proc) per event relayed,
  proxy / relay.

Each figure is the median over the rounds, and each round's ratio is kept: the machine may be shared, so ratios
within a round are what compare.

    python -m bench.fixed_cost [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.instant_upstream import EVENTS_HEADER, FRAMING_EVENTS, PACE_HEADER
from bench.latency import Load, Target, run_load, write_progress
from bench.payloads import Payload, build
from bench.processes import Server, cpu_seconds

CONCURRENT = 32
EVENTS = 150
PACE = 0.01
STREAMED_CLIENTS = 100
NO_COMPACTION_WINDOW = 4_000_000


@dataclass(frozen=True)
class Sizes:
    """How much load each cell sends."""

    requests_concurrent: int
    requests_single: int
    streams: int
    rounds: int
    max_seconds: float


FULL = Sizes(requests_concurrent=8000, requests_single=3000, streams=300, rounds=3, max_seconds=8.0)
QUICK = Sizes(requests_concurrent=200, requests_single=60, streams=8, rounds=1, max_seconds=1.0)


def loops() -> list[str]:
    """The event loops to measure on: asyncio's, and uvloop when it is installed."""
    return ["asyncio"] + (["uvloop"] if importlib.util.find_spec("uvloop") is not None else [])


@contextmanager
def _pair(workdir: Path, upstream: str, loop: str) -> Iterator[dict[str, Server]]:
    """A bare relay and a proxy on `loop`, in front of `upstream`; stopped on exit."""
    with ExitStack() as stack:
        relay_args = ["-m", "bench.bare_relay", "--port", "0", "--upstream", upstream, "--event-loop", loop]
        proxy_args = ["-m", "proxy.cli", "serve", "--host", "127.0.0.1", "--port", "0", "--upstream", upstream]
        proxy_args += ["--default-context-window", str(NO_COMPACTION_WINDOW), "--event-loop", loop]
        yield {
            "bare relay": stack.enter_context(Server(f"relay-{loop}", relay_args, workdir)),
            "proxy": stack.enter_context(Server(f"proxy-{loop}", proxy_args, workdir, url_on_stderr=True)),
        }


def _rounds(
    servers: dict[str, Server], payload: Payload, load: Load, rounds: int, headers: dict[str, str] | None = None
) -> list[dict[str, dict[str, Any]]]:
    """`rounds` runs of `load` against each server in turn (order rotated each round), each with its CPU seconds."""
    names = list(servers)
    runs = []
    for round_ in range(rounds):
        shift = round_ % len(names)
        figures: dict[str, dict[str, Any]] = {}
        for name in names[shift:] + names[:shift]:
            server = servers[name]
            before = cpu_seconds(server.pid)
            summary = run_load(Target(name, server.url), payload, load, headers)
            summary["cpu_s"] = cpu = cpu_seconds(server.pid) - before
            summary["cpu_us_per_request"] = cpu / (summary["completed"] + load.warmup) * 1e6
            figures[name] = summary
        runs.append(figures)
    return runs


def _requests_row(runs: list[dict[str, dict[str, Any]]], concurrency: int) -> dict[str, Any]:
    ratios = [run["proxy"]["rps"] / run["bare relay"]["rps"] for run in runs]
    return {
        "concurrency": concurrency,
        "relay_cpu_us": statistics.median(run["bare relay"]["cpu_us_per_request"] for run in runs),
        "proxy_cpu_us": statistics.median(run["proxy"]["cpu_us_per_request"] for run in runs),
        "relay_rps": statistics.median(run["bare relay"]["rps"] for run in runs),
        "proxy_rps": statistics.median(run["proxy"]["rps"] for run in runs),
        "proxy_vs_relay_rps": statistics.median(ratios),
        "ratios": ratios,
        "problems": [run[name]["problem"] for run in runs for name in run if "problem" in run[name]],
    }


def _events_row(runs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    def us_per_event(summary: dict[str, Any]) -> float:
        return float(summary["cpu_s"]) / max(1, summary["completed"] * (EVENTS + FRAMING_EVENTS)) * 1e6

    ratios = [us_per_event(run["proxy"]) / us_per_event(run["bare relay"]) for run in runs]
    return {
        "relay_us_per_event": statistics.median(us_per_event(run["bare relay"]) for run in runs),
        "proxy_us_per_event": statistics.median(us_per_event(run["proxy"]) for run in runs),
        "proxy_vs_relay_cpu": statistics.median(ratios),
        "ratios": ratios,
        "problems": [run[name]["problem"] for run in runs for name in run if "problem" in run[name]],
    }


def run(sizes: Sizes, payload: Payload, workdir: Path, log: Path | None = None) -> dict[str, Any]:
    """Every loop's figures: `{loop: {"requests": [32 clients, 1 client], "events": {...}}}`."""
    results: dict[str, Any] = {}
    upstream_args = ["-m", "bench.instant_upstream", "--port", "0", "--bytes-per-token", f"{payload.bytes_per_token}"]
    with Server("fixed-cost-upstream", upstream_args, workdir) as upstream:
        for loop in loops():
            with _pair(workdir, upstream.url, loop) as servers:
                rows = []
                for concurrency, count in ((CONCURRENT, sizes.requests_concurrent), (1, sizes.requests_single)):
                    write_progress(f"fixed cost on {loop}: small, {concurrency} clients", log)
                    warmup = max(concurrency * 4, min(200, count // 10))
                    load = Load(concurrency, count, warmup=warmup, max_seconds=sizes.max_seconds)
                    rows.append(_requests_row(_rounds(servers, payload, load, sizes.rounds), concurrency))
                write_progress(f"fixed cost on {loop}: {sizes.streams} paced streams of {EVENTS} events", log)
                clients = min(STREAMED_CLIENTS, sizes.streams)
                load = Load(clients, sizes.streams, warmup=0, max_seconds=600.0, stream=True)
                paced = {EVENTS_HEADER: str(EVENTS), PACE_HEADER: str(PACE)}
                events = _events_row(_rounds(servers, payload, load, sizes.rounds, paced))
            results[loop] = {"requests": rows, "events": events}
    return results


def table(results: dict[str, Any]) -> list[str]:
    """The markdown lines of the fixed-cost table."""
    lines = [
        "| event loop | relay / proxy req/s, 32 clients | proxy / relay | relay / proxy req/s, 1 client "
        "| proxy / relay | CPU per request, relay / proxy (32 clients) "
        "| CPU per streamed event, relay / proxy | proxy / relay |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for loop, figures in results.items():
        many, one = figures["requests"]
        events = figures["events"]
        lines.append(
            f"| {loop} | {many['relay_rps']:.0f} / {many['proxy_rps']:.0f} | {many['proxy_vs_relay_rps']:.2f} "
            f"| {one['relay_rps']:.0f} / {one['proxy_rps']:.0f} | {one['proxy_vs_relay_rps']:.2f} "
            f"| {many['relay_cpu_us']:.0f} / {many['proxy_cpu_us']:.0f} µs "
            f"| {events['relay_us_per_event']:.1f} / {events['proxy_us_per_event']:.1f} µs "
            f"| {events['proxy_vs_relay_cpu']:.2f}x |"
        )
    return lines


def targets(results: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """Issue 38's targets on each loop, as (target, what this run reached, met)."""
    checks = []
    for loop, figures in results.items():
        many, one = figures["requests"]
        cpu = figures["events"]["proxy_vs_relay_cpu"]
        checks += [
            (
                f"proxy req/s at least 0.8 of the relay's, 32 clients ({loop})",
                f"{many['proxy_vs_relay_rps']:.2f}",
                many["proxy_vs_relay_rps"] >= 0.8,
            ),
            (
                f"proxy req/s at least 0.9 of the relay's, 1 client ({loop})",
                f"{one['proxy_vs_relay_rps']:.2f}",
                one["proxy_vs_relay_rps"] >= 0.9,
            ),
            (f"CPU per streamed event at most 1.2x the relay's ({loop})", f"{cpu:.2f}x", cpu <= 1.2),
        ]
    return checks


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table and the JSON figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few seconds' worth (figures not worth quoting)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="compaction-fixed-cost-") as temp:
        workdir = Path(temp)
        results = run(QUICK if args.quick else FULL, build("small", 1_000, workdir), workdir)
    print("\n".join(table(results)))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
