"""What exact counting adds to a request: the compaction decision with and without asking the server to count.

A conversation of about `--tokens` tokens is sent, then re-sent `--turns` times with two new messages each time,
through the proxy's compaction side (`CompactionPipeline.prepare`, no client socket), once with `count_probes`
off and once with them on, and each of those once with the server's usage reported after every request (the usual
case: a re-sent request then asks nothing) and once without (`_unreported`: each re-sent request asks the count of
the grown prompt, on llama.cpp one `/apply-template` of the conversation and one `/tokenize` of only the new text).
The wait is up to `exact_count_timeout`, raised here so the full cost is measured, not cut short at 50 ms. The
upstream is a real llama-server serving SmolLM2 when the real-model tier's build and model are present, else the
loopback fake of `tests.support.counting_upstream` in this process (whose Python tokenizer then runs on the same
event loop).

    python -m bench.exact_counts [--tokens 4000 32000] [--turns 20]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from proxy.config import Settings
from proxy.config.compaction import DEFAULT_COUNT_PROBES
from proxy.engine import counter_for_model
from proxy.formats.chat_completions.wire import CHAT_COMPLETIONS
from proxy.pipeline.exchange import ForwardPlan, IncomingRequest, UpstreamOutcome
from proxy.pipeline.service import CompactionPipeline
from tests.real_upstream.conftest import llama_server_binary, smollm2_gguf, start_llama_server, stop
from tests.support.counting_upstream import CountingUpstream

MODEL = "smollm2-135m-instruct"
READING = "Station {i} reported 21.{i} degrees, 64% humidity and a steady north-west wind of 12 km/h. "


def turn(index: int) -> list[dict[str, Any]]:
    """One user message and its answer, about 200 tokens."""
    report = "".join(READING.format(i=index * 10 + k) for k in range(6))
    return [
        {"role": "user", "content": f"Batch {index}: {report} Summarize the changes."},
        {"role": "assistant", "content": f"Batch {index} noted: temperatures and winds are steady. {report[:200]}"},
    ]


def conversation(tokens: int) -> list[dict[str, Any]]:
    """A system prompt and as many turns as make about `tokens` tiktoken tokens."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You track weather station readings."}]
    counter = counter_for_model(MODEL)
    index = 0
    while counter.messages_tokens(messages) < tokens:
        messages.extend(turn(index))
        index += 1
    return messages


@contextlib.asynccontextmanager
async def upstream() -> AsyncIterator[tuple[str, str]]:
    """The counting upstream's origin and what it is: a real llama-server when built, else the loopback fake."""
    binary, model = llama_server_binary(), smollm2_gguf()
    if binary is None or model is None:
        async with CountingUpstream() as fake:
            yield fake.url, "fake llama.cpp (in-process)"
        return
    with tempfile.TemporaryDirectory() as folder:
        process, url = await asyncio.to_thread(start_llama_server, binary, model, Path(folder) / "llama-server.log")
        try:
            yield url, "llama-server (SmolLM2-135M)"
        finally:
            stop(process)


async def server_count(http: aiohttp.ClientSession, url: str, messages: list[dict[str, Any]]) -> int:
    """The prompt tokens the server would report for `messages` (asked outside the timed part)."""
    async with http.post(url + "/apply-template", json={"messages": messages}) as answer:
        prompt = (await answer.json())["prompt"]
    content = {"content": prompt, "add_special": True, "parse_special": True}
    async with http.post(url + "/tokenize", json=content) as answer:
        return len((await answer.json())["tokens"])


async def run(
    url: str, history: list[dict[str, Any]], turns: int, probes: list[str], *, reports: bool
) -> dict[str, Any]:
    """Decision times of the cold request and of each re-sent one, and how the counts went.

    :param reports: Tell the service the server's usage for each request, as an upstream answering with usage does;
        without them every re-sent request is asked about (only its new text, on llama.cpp).
    """
    # A window whose trigger (2.2 times the last request's tiktoken count) neither count reaches.
    final = counter_for_model(MODEL).messages_tokens(history) + 300 * turns
    windows = {MODEL: int(2.2 * final / 0.7)}
    settings = Settings(
        upstream=url, context_windows=windows, count_probes=probes, exact_count_timeout=5.0, window_probes=[]
    )
    service = CompactionPipeline(settings)
    counter_for_model(MODEL)._cache.clear()
    messages, times, exact = list(history), [], 0
    http = aiohttp.ClientSession()
    try:
        for index in range(turns + 1):
            body = json.dumps({"model": MODEL, "messages": messages}).encode()
            started = time.perf_counter()
            plan = await service.prepare(
                IncomingRequest(body=body, headers={}, path="/v1/chat/completions", wire=CHAT_COMPLETIONS)
            )
            times.append(time.perf_counter() - started)
            assert isinstance(plan, ForwardPlan)
            headers = plan.response_headers
            assert headers["X-Compaction"] == "unchanged", headers
            exact += headers.get("X-Compaction-Count") == "exact"
            question, reply = turn(10_000 + index)
            if reports:
                prompt = await server_count(http, url, messages)
                usage = {"prompt_tokens": prompt, "completion_tokens": 40, "total_tokens": prompt + 40}
                await service.complete(plan, UpstreamOutcome(status=200, usage=usage, reply=reply))
            messages = [*messages, reply, question]
    finally:
        await service.aclose()
        await http.close()
    return {"cold_ms": times[0] * 1000, "resend_ms": statistics.median(times[1:]) * 1000, "exact": exact}


async def main(sizes: list[int], turns: int) -> dict[str, Any]:
    counter_for_model(MODEL).text_tokens("warm up the encoder")
    rows = []
    async with upstream() as (url, kind):
        for tokens in sizes:
            history = conversation(tokens)
            row: dict[str, Any] = {"tokens": tokens, "messages": len(history)}
            for reports in (True, False):
                local = await run(url, history, turns, [], reports=reports)
                counted = await run(url, history, turns, list(DEFAULT_COUNT_PROBES), reports=reports)
                suffix = "" if reports else "_unreported"
                if reports:
                    row |= {"local_cold_ms": local["cold_ms"], "exact_cold_ms": counted["cold_ms"]}
                row |= {
                    f"local_resend{suffix}_ms": local["resend_ms"],
                    f"exact_resend{suffix}_ms": counted["resend_ms"],
                    f"exact_requests{suffix}": f"{counted['exact']}/{turns + 1}",
                }
            rows.append(row)
    return {"upstream": kind, "turns": turns, "rows": rows}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[4_000, 32_000])
    parser.add_argument("--turns", type=int, default=20)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.tokens, args.turns)), indent=2))
