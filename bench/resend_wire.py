"""A 400k-token conversation re-sent with two new messages each turn, through the whole proxy and through the relay.

`bench.resend` times the compaction decision alone; this sends the same requests over sockets, as an agent does: each
turn is the last one's body plus an assistant tool call and its result, posted to the proxy and to the bare relay (in
alternating order, so a noisy neighbour hits both alike), both in front of the instant upstream. The proxy recognizes
each turn from its bytes and works on the two new messages only (`proxy.formats.chat_completions.splice`); the
relay forwards the same bytes without reading them. The first turns are not measured: the proxy sees the
conversation for the first time.

    python -m bench.resend_wire --relay URL --proxy URL [--tokens 400000] [--turns 30]

prints one JSON object: p50 latencies of both, their ratio, the body size and what the proxy reported doing.
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
from typing import Any

import aiohttp
import orjson

from bench.payloads import CHAT_PATH, MODEL
from bench.resend import PARAGRAPH, conversation

WARM_TURNS = 3


def next_turn(messages: list[dict[str, Any]], turn: int) -> list[dict[str, Any]]:
    """The conversation with two new messages: a tool call and its result."""
    call = f"call_resend_{turn}"
    return [
        *messages,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call, "type": "function", "function": {"name": "read_file", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": call, "content": PARAGRAPH * 3},
    ]


async def _post(http: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, str]:
    started = time.perf_counter()
    async with http.post(url + CHAT_PATH, data=body, headers={"Content-Type": "application/json"}) as response:
        await response.read()
        if response.status != 200:
            raise RuntimeError(f"{url} answered {response.status}")
        return time.perf_counter() - started, response.headers.get("X-Compaction", "-")


async def measure(relay: str, proxy: str, tokens: int, turns: int) -> dict[str, Any]:
    """Send `turns` measured turns (after `WARM_TURNS`) to both; return the figures."""
    messages = conversation(tokens)
    times: dict[str, list[float]] = {"relay": [], "proxy": []}
    decisions: Counter[str] = Counter()
    body = b""
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer sk-bench"}) as http:
        for turn in range(WARM_TURNS + turns):
            messages = next_turn(messages, turn)
            body = orjson.dumps({"model": MODEL, "messages": messages})
            order = [("relay", relay), ("proxy", proxy)]
            for name, url in order if turn % 2 else order[::-1]:
                elapsed, decided = await _post(http, url, body)
                if turn >= WARM_TURNS:
                    times[name].append(elapsed * 1000)
                    if name == "proxy":
                        decisions[decided] += 1
    relay_p50, proxy_p50 = statistics.median(times["relay"]), statistics.median(times["proxy"])
    return {
        "tokens": tokens,
        "messages": len(messages),
        "body_bytes": len(body),
        "turns": turns,
        "relay_p50_ms": relay_p50,
        "proxy_p50_ms": proxy_p50,
        "proxy_vs_relay": proxy_p50 / relay_p50,
        "x_compaction": dict(decisions),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the flags, measure, print the JSON figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--relay", required=True, help="base URL of the bare relay")
    parser.add_argument("--proxy", required=True, help="base URL of the proxy")
    parser.add_argument("--tokens", type=int, default=400_000)
    parser.add_argument("--turns", type=int, default=30)
    args = parser.parse_args(argv)
    print(json.dumps(asyncio.run(measure(args.relay, args.proxy, args.tokens, args.turns))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
