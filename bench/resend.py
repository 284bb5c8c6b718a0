"""A 400k-token conversation decided cold, then sent again twice, each time with two new messages.

Runs the proxy's compaction side exactly as the server does (parse, rewrite memory, anchor, count, decide,
compact, serialize), without sockets. `resend_ms` is the steady state: the request extends one the proxy handled
unchanged, so it is recognized from its bytes and only the new messages are worked on
(`proxy.formats.chat_completions.splice`).
`full_path_resend_ms` is the same request through a service that parses every request in full, the reference the
shortcut is tested against; `after_compaction_ms` is the turn right after the compaction.

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

from proxy.config import Settings
from proxy.engine import TiktokenCounter, counter_for_model
from proxy.formats.chat_completions.wire import CHAT_COMPLETIONS
from proxy.pipeline.exchange import ForwardPlan, IncomingRequest, UpstreamOutcome
from proxy.pipeline.service import CompactionPipeline

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


async def decide(service: CompactionPipeline, body: bytes) -> tuple[float, ForwardPlan]:
    started = time.perf_counter()
    plan = await service.prepare(
        IncomingRequest(
            body=body, headers={"Authorization": "Bearer sk-bench"}, path="/v1/chat/completions", wire=CHAT_COMPLETIONS
        )
    )
    elapsed = time.perf_counter() - started
    assert isinstance(plan, ForwardPlan)
    return elapsed, plan


async def answer(service: CompactionPipeline, plan: ForwardPlan, call: str) -> dict[str, Any]:
    """Report the provider's usage for what was sent, as the upstream would, and return its reply (one tool call)."""
    sent = orjson.loads(plan.body)["messages"]
    reply = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call, "type": "function", "function": {"name": "read_file", "arguments": "{}"}}],
    }
    usage = {"prompt_tokens": counter_for_model(MODEL).messages_tokens(sent) + 3, "completion_tokens": 12}
    usage["total_tokens"] = usage["prompt_tokens"] + 12
    await service.complete(plan, UpstreamOutcome(status=200, usage=usage, reply=reply))
    return reply


async def turns(service: CompactionPipeline, history: list[dict[str, Any]], round_: int) -> list[float]:
    """The decision times of three turns: cold (it compacts), then twice the conversation with two new messages.

    The second turn follows a compaction, so the view it extends is computed again; the third extends a request the
    proxy handled unchanged, which is the steady state of an agent's conversation.
    """
    times, messages = [], history
    for turn in range(3):
        elapsed, plan = await decide(service, orjson.dumps({"model": MODEL, "messages": messages}))
        expected = "compacted" if turn == 0 else "unchanged"
        assert plan.response_headers.get("X-Compaction") == expected, plan.response_headers
        times.append(elapsed)
        call = f"call_x{round_}_{turn}"
        reply = await answer(service, plan, call)
        messages = [*messages, reply, {"role": "tool", "tool_call_id": call, "content": PARAGRAPH * 3}]
    return times


async def main(tokens: int, repeat: int) -> dict[str, Any]:
    counter_for_model(MODEL).text_tokens("warm up the encoder")
    history = conversation(tokens)
    body = orjson.dumps({"model": MODEL, "messages": history})
    settings = Settings(context_windows={MODEL: int(tokens / 0.75)}, compact_at=0.7, compact_to=0.4)
    spliced, full = [], []
    for round_ in range(repeat):
        for service, times in (
            (CompactionPipeline(settings), spliced),
            (CompactionPipeline(settings, splice_from=None), full),
        ):
            counter_for_model(MODEL)._cache.clear()
            times.append(await turns(service, history, round_))
    result = {
        "tokens": tokens,
        "messages": len(history),
        "body_bytes": len(body),
        "cold_ms": statistics.median(times[0] for times in spliced) * 1000,
        "after_compaction_ms": statistics.median(times[1] for times in spliced) * 1000,
        "resend_ms": statistics.median(times[2] for times in spliced) * 1000,
        "full_path_resend_ms": statistics.median(times[2] for times in full) * 1000,
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
