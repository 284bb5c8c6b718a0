"""The proxy's uncached tokens by cause (`bench.misses`) on `bench.recall`'s conversations, where it offloads.

    python -m bench.misses_recall [--window 32768] [--markdown]

The format agents of `bench.misses` repeat their tool results, so compaction removes duplicates and never offloads:
the read tool never comes or goes. `bench.recall`'s generated conversations (coding, research and data work, seed 1,
2.5 times the window long, every tool result its own) run turn by turn through the proxy at its defaults in each
format, as `bench.recall` sends them, and every forwarded request's uncached tokens get their causes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from bench import recall
from bench.misses import CAUSES, Causes, breakdown, ceiling_of, forwarded, share
from bench.recall_conversations import SHAPES, Conversation, conversation
from bench.recall_runs import KEY, RunFailed
from bench.recall_wire import WIRES, Wire, script
from tests.support.proxies import LoopbackProxies

SEED: Final = 1


async def one(generated: Conversation, wire: Wire, window: int) -> dict[str, Any]:
    """One conversation in one format through a fresh proxy: its cached share and its uncached tokens by cause."""
    decisions: list[str] = []
    async with wire.upstream(window) as upstream:
        wire.install(upstream, script(generated))
        proxies = LoopbackProxies(upstream=upstream.base_url, context_windows={wire.case.model: window})
        try:
            proxy = await proxies.start()
            for n in generated.calls():
                status, headers, answer = await wire.case.post(proxy, wire.body(generated, n), key=KEY)
                if status != 200:
                    raise RunFailed(f"{generated.name}, {wire.name}, call {n}: {status} {answer}")
                decisions.append(headers.get("X-Compaction", ""))
        finally:
            await proxies.close()
        requests = forwarded(wire.case, upstream, decisions)
    total = Causes()
    for causes in breakdown(wire.case, requests, ceiling_of(proxy.settings, window)):
        total.merge(causes)
    return {
        "conversation": generated.name,
        "format": wire.name,
        "requests": len(requests),
        "compactions": decisions.count("compacted"),
        "cached_share": share([request.usage for request in requests]),
        "uncached_by_cause": total.tokens,
    }


async def measure(window: int) -> list[dict[str, Any]]:
    """Every shape in every format."""
    rows = []
    for shape in SHAPES:
        generated = conversation(shape, SEED, int(recall.FILL * window))
        for wire in WIRES:
            rows.append(await one(generated, wire, window))
    return rows


def markdown(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per conversation and format: its cached share, then its uncached tokens by cause."""
    lines = [
        f"| conversation | format | requests, compactions | cached | {' | '.join(CAUSES)} |",
        "| --- | --- | ---: | ---: |" + " ---: |" * len(CAUSES),
    ]
    for row in rows:
        causes = " | ".join(str(row["uncached_by_cause"][cause]) for cause in CAUSES)
        lines.append(
            f"| {row['conversation']} | {row['format']} | {row['requests']}, {row['compactions']} "
            f"| {row['cached_share']:.1%} | {causes} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Measure, print JSON or the markdown table."""
    parser = argparse.ArgumentParser(prog="python -m bench.misses_recall", description=__doc__)
    parser.add_argument("--window", type=int, default=recall.WINDOWS[0], help="the model's context window")
    parser.add_argument("--markdown", action="store_true", help="print the table, not JSON")
    options = parser.parse_args(argv)
    rows = asyncio.run(measure(options.window))
    print("\n".join(markdown(rows)) if options.markdown else json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
