"""Resident memory of a relay process at idle and while N very large requests are in flight against a slow upstream.

For each N a fresh relay process (the proxy, or the bare relay for comparison) is started, its idle VmRSS read, then
N copies of the very large body are sent at once with `X-Bench-Delay` so the upstream holds them all; VmRSS is
sampled every 20 ms until the answers are back, and the peak kept. Per in-flight request = (peak - warm) / N, where
warm is after one small request. VmRSS is read once more after the answers: what stays is what the process keeps
between requests (the proxy remembers each conversation's last request, bounded by `prefix_memory_bytes`) plus
freed memory the allocator has not given back.

Two cases: the proxy sees the conversation for the first time (it parses the body and remembers it: a one-off per
conversation, charged here to the requests in flight), or the conversation is re-sent, as an agent re-sends its
history every turn (warm is then after one request of the very large body itself).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from typing import Any

from bench.latency import Load, Target, run_load
from bench.payloads import Payload
from bench.processes import Server, rss_kib

SAMPLE_SECONDS = 0.02


@dataclass(frozen=True)
class MemoryRow:
    """One measurement (sizes in MiB)."""

    relay: str
    conversation: str
    in_flight: int
    idle_mib: float
    warm_mib: float
    peak_mib: float
    after_mib: float
    per_request_mib: float
    body_mib: float


def _peak_during(pid: int, work: Callable[[], Any]) -> int:
    """Run `work` while sampling the process's VmRSS; return the highest reading, in KiB."""
    peak = rss_kib(pid)
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            try:
                peak = max(peak, rss_kib(pid))
            except (OSError, RuntimeError):
                return
            time.sleep(SAMPLE_SECONDS)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        work()
    finally:
        done.set()
        sampler.join()
    return peak


def measure(
    relay: str,
    start: Callable[[], AbstractContextManager[Server]],
    payload: Payload,
    warm_payload: Payload,
    *,
    in_flight: int,
    delay_seconds: float,
    resent: bool = False,
) -> MemoryRow:
    """Idle and peak VmRSS of a fresh relay process while `in_flight` copies of `payload` wait on the upstream.

    `warm` is read after one small request (`warm_payload`), which loads what every first request loads (the
    tokenizer's tables); the per-request figure is counted from there.

    :param resent: Send `payload` itself once before `warm` is read: the requests in flight re-send a conversation
        the relay has seen.
    """
    with start() as server:
        time.sleep(0.5)
        idle = rss_kib(server.pid)
        once = Load(concurrency=1, requests=1, warmup=0, max_seconds=30.0)
        run_load(Target(relay, server.url), warm_payload, once)
        if resent:
            run_load(Target(relay, server.url), payload, once)
        time.sleep(0.2)
        warm = rss_kib(server.pid)
        load = Load(concurrency=in_flight, requests=in_flight, warmup=0, max_seconds=60.0)
        target = Target(relay, server.url, {"X-Bench-Delay": str(delay_seconds)})
        peak = _peak_during(server.pid, lambda: run_load(target, payload, load))
        time.sleep(0.5)
        after = rss_kib(server.pid)
    return MemoryRow(
        relay=relay,
        conversation="re-sent" if resent else "first sight",
        in_flight=in_flight,
        idle_mib=idle / 1024,
        warm_mib=warm / 1024,
        peak_mib=peak / 1024,
        after_mib=after / 1024,
        per_request_mib=(peak - warm) / 1024 / in_flight,
        body_mib=payload.size / 1024 / 1024,
    )


def median_row(rounds: int, measuring: Callable[[], MemoryRow]) -> MemoryRow:
    """`measuring()` run `rounds` times (a fresh process each): the row whose per-request figure is the median.

    Resident memory moves with what the allocator happens to keep, so a single reading can land far from the others.
    """
    rows = sorted((measuring() for _ in range(rounds)), key=lambda row: row.per_request_mib)
    return rows[len(rows) // 2]


def as_dicts(rows: list[MemoryRow]) -> list[dict[str, Any]]:
    """The rows as JSON-ready dicts."""
    return [asdict(row) for row in rows]
