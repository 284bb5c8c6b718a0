"""A read round's request stays within its bytes and tokens, whatever the model asks and whatever the texts hold.

`ReadBack.next_round` against the real in-memory store and tiktoken counter: any mix of held, repeated and unknown
references, any number of calls, texts of any characters (JSON escapes included), any bounds.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.engine.counting import counter_for_model
from proxy.engine.strategies.offload import content_reference
from proxy.formats.chat_completions.reads import message_reads
from proxy.formats.chat_completions.wire import CHAT_COMPLETIONS
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.offload.reads import NOT_HELD, REPEATED, TOO_LARGE, ReadBack, ReadLimits
from proxy.pipeline.offload.rounds import without_tools
from proxy.pipeline.offload.tool import READ_TOOL
from proxy.simulator.openai_tokens import count_message_tokens
from proxy.state.memory import MemoryStore
from tests.support.examples import examples

TENANT = b"t"
BODY = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "Which run failed?"}]})
COUNTER = counter_for_model("gpt-4o-mini")


def _message(references: list[str]) -> dict[str, Any]:
    calls = [
        {"id": f"read-{k}", "type": "function", "function": {"name": READ_TOOL, "arguments": f'{{"reference": "{r}"}}'}}
        for k, r in enumerate(references)
    ]
    return {"role": "assistant", "content": None, "tool_calls": calls}


async def _rounds(
    texts: list[str], asked: list[list[int]], limits: ReadLimits, tokens: int
) -> list[tuple[bytes, Any, int]]:
    store = MemoryStore()
    held = {content_reference(text): text for text in texts}
    await store.save_offloaded(TENANT, held)
    references = [*held, "offloaded-" + "0" * 32]
    back = ReadBack(TENANT, store, CHAT_COMPLETIONS, limits, CompactionMetrics(), counter=COUNTER, tokens=tokens)
    body, made = BODY, []
    for indices in asked:
        reads = message_reads(_message([references[i % len(references)] for i in indices]), limits.per_answer)
        assert reads is not None
        before = back.tokens
        round_ = await back.next_round(body, reads, last=False)
        made.append((body, round_, before))
        if round_.final:
            break
        back.took(round_)
        body = round_.body
    return made


texts = st.lists(st.text(max_size=4000), min_size=1, max_size=5, unique=True)
asked = st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=40), min_size=1, max_size=4)


@settings(max_examples=examples(60), deadline=None)
@given(texts, asked, st.integers(1, 8), st.integers(200, 30_000), st.integers(50, 8_000))
def test_a_round_stays_within_its_bytes_and_tokens(
    texts: list[str], asked: list[list[int]], per_answer: int, max_bytes: int, room: int
) -> None:
    limits = ReadLimits(rounds=4, per_answer=per_answer, max_bytes=max_bytes, room=room)
    start = 20
    sent: set[str] = set()
    for body, round_, before in asyncio.run(_rounds(texts, asked, limits, start)):
        if round_.final:  # nothing fits: the previous request asks without tools
            assert round_.body == without_tools(body, CHAT_COMPLETIONS)
            continue
        assert len(round_.body) <= max_bytes
        new = orjson.loads(round_.body)["messages"][len(orjson.loads(body)["messages"]) :]
        results = [message["content"] for message in new if message["role"] == "tool"]
        assert len(results) <= per_answer
        added = sum(count_message_tokens(message) for message in new)  # as the provider counts them
        assert before + added <= room
        read = [text for text in results if text not in (NOT_HELD, REPEATED, TOO_LARGE)]
        assert not sent & set(read) and len(set(read)) == len(read)  # each text once per request
        sent |= set(read)
        assert round_.served == len(read)
