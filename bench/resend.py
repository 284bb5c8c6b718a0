"""A 400k-token conversation decided cold, then sent again with two new messages.

Runs the proxy's compaction side exactly as the server does (parse, rewrite memory, anchor, count, decide,
compact, serialize), without sockets, and prints how long the second decision takes as a fraction of the first.

    python -m bench.resend [--tokens 400000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import orjson

from proxy.chat.exchange import ChatOutcome, IncomingChat
from proxy.chat.service import ChatCompactionService
from proxy.config import Settings
from proxy.engine import TiktokenCounter, counter_for_model

MODEL = "gpt-4.1"
PARAGRAPH = (
    "The handler reads the batch, validates each record against the schema, and retries transient failures "
    "three times with exponential backoff before moving the record to the dead-letter queue. "
)


def conversation(tokens: int) -> list[dict[str, Any]]:
    """An agent run of about `tokens` tokens: a task, then steps of one tool call and a ~400-token result each."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a meticulous code reviewer."},
        {"role": "user", "content": "Review every handler in the repository."},
    ]
    counter = TiktokenCounter()
    total = counter.messages_tokens(messages)
    step = 0
    while total < tokens:
        step += 1
        call = {
            "id": f"call_{step}",
            "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/h{step}.py"})},
        }
        result = f"# src/h{step}.py (step {step})\n" + PARAGRAPH * 12
        pair = [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": result},
        ]
        messages.extend(pair)
        total += counter.messages_tokens(pair)
    return messages


async def decide(service: ChatCompactionService, body: bytes) -> tuple[float, Any]:
    started = time.perf_counter()
    plan = await service.prepare(
        IncomingChat(body=body, headers={"Authorization": "Bearer sk-bench"}, path="/v1/chat/completions")
    )
    return time.perf_counter() - started, plan


async def main(tokens: int, repeat: int) -> dict[str, Any]:
    counter_for_model(MODEL).text_tokens("warm up the encoder")
    history = conversation(tokens)
    body = orjson.dumps({"model": MODEL, "messages": history})
    settings = Settings(context_windows={MODEL: int(tokens / 0.75)}, compact_at=0.7, compact_to=0.4)
    cold_times, warm_times = [], []
    for round_ in range(repeat):
        service = ChatCompactionService(settings)
        counter_for_model(MODEL)._cache.clear()
        cold, plan = await decide(service, body)
        sent = orjson.loads(plan.body)["messages"]
        reply = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": f"call_x{round_}", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}
            ],
        }
        usage = {"prompt_tokens": counter_for_model(MODEL).messages_tokens(sent) + 3, "completion_tokens": 12}
        usage["total_tokens"] = usage["prompt_tokens"] + 12
        await service.complete(plan, ChatOutcome(status=200, usage=usage, reply=reply))
        again = [*history, reply, {"role": "tool", "tool_call_id": f"call_x{round_}", "content": PARAGRAPH * 3}]
        warm, warm_plan = await decide(service, orjson.dumps({"model": MODEL, "messages": again}))
        cold_times.append(cold)
        warm_times.append(warm)
        assert plan.response_headers.get("X-Compaction") == "compacted", plan.response_headers
        assert warm_plan.response_headers.get("X-Compaction") == "unchanged", warm_plan.response_headers
    result = {
        "tokens": tokens,
        "messages": len(history),
        "body_bytes": len(body),
        "cold_ms": statistics.median(cold_times) * 1000,
        "resend_ms": statistics.median(warm_times) * 1000,
    }
    result["resend_fraction"] = result["resend_ms"] / result["cold_ms"]
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=400_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    figures = asyncio.run(main(args.tokens, args.repeat))
    print(json.dumps(figures, indent=2))
