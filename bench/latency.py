"""Added latency: the same load sent straight to the instant upstream, through the bare relay, and through the proxy.

Each cell of the matrix (target x payload x concurrency) is one run of `bench.loadgen` in its own process. The
targets of one cell run back to back, so a noisy neighbour on the shared machine hits them alike. Added latency is
the difference of the percentiles (proxied p50 minus direct p50, and so on).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.payloads import Payload
from bench.processes import ROOT


@dataclass(frozen=True)
class Target:
    """Where a load is sent: a base URL and headers every request carries.

    :param name: `direct`, `bare relay`, `proxy` or `proxy, compacting`.
    :param base_url: `http://127.0.0.1:PORT`.
    :param headers: Extra request headers (e.g. `X-Context-Window` to make the proxy compact).
    """

    name: str
    base_url: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Load:
    """How much load one cell sends.

    :param concurrency: Requests in flight at once.
    :param requests: Measured requests (at most).
    :param warmup: Unmeasured requests first.
    :param max_seconds: Stop issuing measured requests after this many seconds.
    :param stream: Ask for an SSE answer.
    """

    concurrency: int
    requests: int
    warmup: int
    max_seconds: float
    stream: bool = False


def run_load(target: Target, payload: Payload, load: Load, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `bench.loadgen` against `target` as a child process and return its JSON summary."""
    args = [
        sys.executable,
        "-m",
        "bench.loadgen",
        "--url",
        target.base_url + payload.route,
        "--body",
        str(payload.path),
        "--concurrency",
        str(load.concurrency),
        "--requests",
        str(load.requests),
        "--warmup",
        str(load.warmup),
        "--max-seconds",
        str(load.max_seconds),
    ]
    if load.stream:
        args.append("--stream")
    for name, value in {**target.headers, **(headers or {})}.items():
        args += ["--header", f"{name}={value}"]
    done = subprocess.run(
        args, cwd=ROOT, capture_output=True, text=True, timeout=load.max_seconds * 6 + 120, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"load generator failed against {target.name}: {done.stderr[-2000:]}")
    summary: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    summary["target"] = target.name
    summary["payload"] = payload.name
    summary["stream"] = load.stream
    bad = {code: n for code, n in summary["statuses"].items() if code != "200"}
    if bad or summary["errors"]:
        summary["problem"] = f"statuses {bad} errors {summary['errors']}"
    return summary


MEDIAN_FIELDS = ("rps", "p50_ms", "p90_ms", "p99_ms", "mean_ms", "ttfb_p50_ms", "ttfb_p99_ms")
"""Figures of a cell taken as the median over its rounds; the rest are the first round's."""


def run_cell(
    targets: list[Target], payload: Payload, load: Load, rounds: int = 1, once: frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    """Run the same load against every target in turn, `rounds` times, each round in a rotated order.

    Each target's figures are the medians over its rounds, so a noisy neighbour on the shared machine moves a cell
    only if it lasts through most of them.

    :param once: Targets measured in the first round only (a peer far slower than the rest).
    """
    runs: dict[str, list[dict[str, Any]]] = {target.name: [] for target in targets}
    for round_ in range(rounds):
        shift = round_ % len(targets)
        for target in targets[shift:] + targets[:shift]:
            if round_ == 0 or target.name not in once:
                runs[target.name].append(run_load(target, payload, load))
    return [median_summary(runs[target.name]) for target in targets]


def median_summary(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    merged = {**summaries[0], "rounds": len(summaries)}
    for name in MEDIAN_FIELDS:
        merged[name] = statistics.median(summary[name] for summary in summaries)
    problems = [summary["problem"] for summary in summaries if "problem" in summary]
    if problems:
        merged["problem"] = "; ".join(problems)
    return merged


def write_progress(line: str, log: Path | None = None) -> None:
    """Tell the operator what is being measured (stderr, so the table on stdout stays clean)."""
    line = f"{time.strftime('%H:%M:%S')} {line}"
    print(line, file=sys.stderr, flush=True)
    if log is not None:
        with log.open("a") as handle:
            handle.write(line + "\n")
