"""The load generator: runs in its own process, sends one request body over and over, reports latencies as JSON.

`concurrency` workers share one keep-alive `aiohttp.ClientSession` (one pooled connection per worker) and send
`requests` requests in all (after `warmup` unmeasured ones), stopping early once `max_seconds` have passed. Each
latency is from sending the request line to reading the last byte of the answer; for streamed answers the time to
the first body byte is recorded too.

    python -m bench.loadgen --url http://127.0.0.1:PORT/v1/chat/completions --body FILE \
        [--concurrency 1] [--requests 1000] [--warmup 50] [--max-seconds 30] [--stream] [--header NAME=VALUE]

Prints one JSON object on stdout: counts, statuses, requests per second, and latency percentiles in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

STREAM_HEADER = "X-Bench-Stream"


def percentile(values: Sequence[float], fraction: float) -> float:
    """The `fraction` quantile of `values` (nearest rank); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[rank]


async def _one(
    session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> tuple[int, float, float, str]:
    """Send one request; return its status, total and first-body-byte seconds, and its `X-Compaction` header."""
    started = time.perf_counter()
    first = 0.0
    async with session.post(url, data=body, headers=headers) as response:
        async for _chunk in response.content.iter_any():
            if not first:
                first = time.perf_counter() - started
        status = response.status
        compaction = response.headers.get("X-Compaction", "-")
    return status, time.perf_counter() - started, first, compaction


async def run(
    url: str,
    body: bytes,
    *,
    concurrency: int,
    requests: int,
    warmup: int,
    max_seconds: float,
    headers: dict[str, str],
) -> dict[str, Any]:
    """Run the load and summarize it (latencies in milliseconds)."""
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=max(60.0, max_seconds * 4))
    latencies: list[float] = []
    ttfbs: list[float] = []
    statuses: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    compaction: Counter[str] = Counter()
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, skip_auto_headers=("User-Agent",)
    ) as session:
        warm = iter(range(warmup))

        async def warm_worker() -> None:
            for _ in warm:
                await _one(session, url, body, headers)

        await asyncio.gather(*(warm_worker() for _ in range(min(concurrency, max(warmup, 1)))))

        remaining = iter(range(requests))
        deadline = time.perf_counter() + max_seconds

        async def worker() -> None:
            for _ in remaining:
                if time.perf_counter() > deadline:
                    return
                try:
                    status, elapsed, first, decided = await _one(session, url, body, headers)
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    errors[type(exc).__name__] += 1
                    continue
                statuses[status] += 1
                compaction[decided] += 1
                latencies.append(elapsed)
                ttfbs.append(first)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    ms = [value * 1000 for value in latencies]
    ttfb_ms = [value * 1000 for value in ttfbs]
    return {
        "url": url,
        "body_bytes": len(body),
        "concurrency": concurrency,
        "completed": len(ms),
        "statuses": {str(code): count for code, count in statuses.items()},
        "errors": dict(errors),
        "x_compaction": dict(compaction),
        "wall_s": wall,
        "rps": len(ms) / wall if wall else 0.0,
        "p50_ms": percentile(ms, 0.50),
        "p90_ms": percentile(ms, 0.90),
        "p99_ms": percentile(ms, 0.99),
        "mean_ms": statistics.fmean(ms) if ms else 0.0,
        "max_ms": max(ms, default=0.0),
        "ttfb_p50_ms": percentile(ttfb_ms, 0.50),
        "ttfb_p99_ms": percentile(ttfb_ms, 0.99),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the flags, run the load, print the JSON summary."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--body", type=Path, required=True, help="file holding the request body")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--max-seconds", type=float, default=30.0)
    parser.add_argument("--stream", action="store_true", help="ask the instant upstream for an SSE answer")
    parser.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
    for item in args.header:
        name, _, value = item.partition("=")
        headers[name] = value
    if args.stream:
        headers[STREAM_HEADER] = "1"
    summary = asyncio.run(
        run(
            args.url,
            args.body.read_bytes(),
            concurrency=args.concurrency,
            requests=args.requests,
            warmup=args.warmup,
            max_seconds=args.max_seconds,
            headers=headers,
        )
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
