"""The compaction that brings the read tool leaves room for it; one that does not, or a conversation keeping the tool
already (its tokens counted with the request's tools), reserves nothing."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import event, given, settings
from hypothesis import strategies as st

from proxy.config import Settings
from proxy.engine import Transcript, counter_for_model
from proxy.engine.plan import EditPlan
from proxy.engine.strategies.chain import CompactionResult, KeepingMore
from proxy.engine.strategies.offload import held_references
from proxy.engine.strategies.registry import chain_by_names
from proxy.formats.chat_completions.request import ChatRequest
from proxy.formats.chat_completions.wire import CHAT_COMPLETIONS
from proxy.pipeline.compacting import chain_names
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.offload.offloading import Offloading
from proxy.pipeline.offload.reserving import ReadToolRoom
from proxy.pipeline.offload.tool import read_tool_tokens
from proxy.state.memory import MemoryStore
from tests.support.examples import examples

MODEL = "gpt-4o-mini"


@st.composite
def tool_steps(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A task of tool steps whose results are logs of distinct lines, some large enough to offload."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Go."}]
    for step in range(draw(st.integers(min_value=1, max_value=8))):
        call = {"id": f"call_{step}", "type": "function", "function": {"name": "run", "arguments": "{}"}}
        lines = draw(st.integers(min_value=0, max_value=300))
        log = "\n".join(f"step {step} line {line}: checked module m{line * 7 % 97}" for line in range(lines))
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": log},
        ]
    return [*messages, {"role": "assistant", "content": "Done."}]


def offloading() -> Offloading:
    proxy_settings = Settings()
    base = chain_by_names(chain_names(proxy_settings.strategies))
    return Offloading(proxy_settings, MemoryStore(), base, CompactionMetrics)


def plan_of(result: CompactionResult | None) -> EditPlan | None:
    return None if result is None else result.plan


def request_of(transcript: Transcript) -> ChatRequest:
    return ChatRequest.parse(orjson.dumps({"model": MODEL, "messages": transcript.messages}))


@settings(max_examples=examples(200), deadline=None)
@given(messages=tool_steps(), fraction=st.floats(min_value=0.1, max_value=0.9))
def test_a_compaction_leaving_references_leaves_room_for_the_read_tool(
    messages: list[dict[str, Any]], fraction: float
) -> None:
    transcript = Transcript(messages, counter_for_model(MODEL))
    target = int(transcript.total() * fraction)
    request = request_of(transcript)
    reserved = read_tool_tokens(request, CHAT_COMPLETIONS, Settings().offload_max_tools)
    _, chain = offloading().for_request(request, CHAT_COMPLETIONS, off=False)
    assert isinstance(chain, KeepingMore) and isinstance(chain.preferred, ReadToolRoom)
    room, plain = chain.preferred, chain.preferred.chain
    got, unreserved = room.compact(transcript, target), plain.compact(transcript, target)
    if unreserved is None or not held_references(unreserved.compacted.meta):
        assert plan_of(got) == plan_of(unreserved), "a compaction that brings no tool reserves nothing"
        return
    event("the compaction leaves offloaded results")
    if unreserved.tokens_after > target - reserved:
        event("without room for the read tool, it would be over the target")
    assert got is not None
    reachable = plain.compact(transcript, target - reserved)
    if held_references(got.compacted.meta) and reachable is not None and reachable.tokens_after <= target - reserved:
        assert got.tokens_after <= target - reserved


def test_a_conversation_keeping_the_tool_counts_it_with_its_tools_instead() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello."}]
    request = request_of(Transcript(messages, counter_for_model(MODEL)))
    proxy = offloading()
    _, chain = proxy.for_request(request, CHAT_COMPLETIONS, off=False, kept=True)
    assert isinstance(chain, KeepingMore) and not isinstance(chain.preferred, ReadToolRoom)
    counter = counter_for_model(MODEL)
    counted = proxy.counted(request, CHAT_COMPLETIONS, kept=True)
    grown = counter.overhead_tokens(counted.overhead_fields) - counter.overhead_tokens(request.overhead_fields)
    assert 0 < grown <= read_tool_tokens(request, CHAT_COMPLETIONS, Settings().offload_max_tools)
    assert proxy.counted(request, CHAT_COMPLETIONS, kept=False) is request
