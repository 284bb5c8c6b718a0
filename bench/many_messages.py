"""Requests of very many tiny messages: the compaction decision must cost the same per message at any count.

A hostile (or merely odd) client can send hundreds of thousands of one-word messages in a few megabytes. Runs the
proxy's compaction side exactly as the server does (parse, key, rewrite memory, anchor, count, decide, compact,
serialize), without sockets, once with a window that makes the request compact (`X-Context-Window`) and once with one
that does not, and prints the time per message at each count: flat means linear.

    python -m bench.many_messages [--counts 50000 200000 1000000] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import time
from typing import Any

import orjson

from proxy.config import Settings
from proxy.engine import counter_for_model
from proxy.formats.chat_completions.wire import CHAT_COMPLETIONS
from proxy.pipeline.exchange import IncomingRequest
from proxy.pipeline.service import CompactionPipeline

MODEL = "gpt-4.1"
COMPACTING_WINDOW = 10_000
"""Far below what any measured request holds, so the request compacts."""
ROOMY_WINDOW = 1_000_000_000
"""Far above what any measured request holds, so the request is decided without compacting."""


def body(count: int) -> bytes:
    """A chat completion of `count` one-word messages, alternating user and assistant, each distinct."""
    roles = ("user", "assistant")
    messages = [{"role": roles[index % 2], "content": f"w{index}"} for index in range(count)]
    messages.append({"role": "user", "content": "continue"})
    return orjson.dumps({"model": MODEL, "messages": messages})


async def decide(raw: bytes, window: int) -> tuple[float, str]:
    """Seconds one cold decision takes on a fresh service and counter cache, and the `X-Compaction` it reports."""
    service = CompactionPipeline(Settings())
    counter_for_model(MODEL)._cache.clear()
    headers = {"Authorization": "Bearer sk-bench", "X-Context-Window": str(window)}
    started = time.perf_counter()
    plan = await service.prepare(
        IncomingRequest(body=raw, headers=headers, path="/v1/chat/completions", wire=CHAT_COMPLETIONS)
    )
    elapsed = time.perf_counter() - started
    await service.aclose()
    return elapsed, plan.response_headers.get("X-Compaction", "")


async def main(counts: list[int]) -> list[dict[str, Any]]:
    counter_for_model(MODEL).text_tokens("warm up the encoder")
    rows = []
    for count in counts:
        raw = body(count)
        for case, window in (("compacting", COMPACTING_WINDOW), ("not compacting", ROOMY_WINDOW)):
            seconds, outcome = await decide(raw, window)
            rows.append(
                {
                    "messages": count,
                    "body_bytes": len(raw),
                    "case": case,
                    "outcome": outcome,
                    "seconds": seconds,
                    "us_per_message": seconds / count * 1e6,
                }
            )
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    """The figures as a markdown table."""
    lines = [
        "| messages | body | case | X-Compaction | decision | per message |",
        "|---:|---:|---|---|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['messages']:,} | {row['body_bytes'] / 1e6:.1f} MB | {row['case']} | {row['outcome']} "
            f"| {row['seconds']:.2f} s | {row['us_per_message']:.1f} µs |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[50_000, 200_000, 1_000_000])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    parser.add_argument("--profile", action="store_true", help="print the top functions by cumulative time")
    args = parser.parse_args()
    profiler = cProfile.Profile() if args.profile else None
    if profiler is not None:
        profiler.enable()
    figures = asyncio.run(main(args.counts))
    if profiler is not None:
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
    print(json.dumps(figures, indent=2) if args.json else render(figures))
