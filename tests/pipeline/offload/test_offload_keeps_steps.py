"""Offloading never costs more of a conversation than plain pruning would, whatever the window."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config import Settings
from proxy.engine import Transcript, counter_for_model
from proxy.engine.strategies.registry import chain_by_names
from proxy.formats.chat_completions.request import ChatRequest
from proxy.formats.chat_completions.wire import CHAT_COMPLETIONS
from proxy.pipeline.compacting import chain_names
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.offload.offloading import Offloading
from proxy.state.memory import MemoryStore
from tests.engine.conversations import Conversation, conversations

WINDOWS = (4096, 8192, 16384)


def removed(offloading: Offloading, transcript: Transcript, target: int, *, off: bool) -> int:
    """How many of the conversation's messages the request's chain removes (neither kept nor stood in for)."""
    request = ChatRequest.parse(orjson.dumps({"model": "gpt-4o-mini", "messages": transcript.messages}))
    _, chain = offloading.for_request(request, CHAT_COMPLETIONS, off)
    result = chain.compact(transcript, target)
    return result.plan.removed_count() if result is not None else 0


@settings(deadline=None)
@given(conversation=conversations(max_turns=8, max_steps=5), window=st.sampled_from(WINDOWS))
def test_offload_on_never_removes_more_than_offload_off(conversation: Conversation, window: int) -> None:
    proxy_settings = Settings()
    base = chain_by_names(chain_names(proxy_settings.strategies))
    offloading = Offloading(proxy_settings, MemoryStore(), base, CompactionMetrics)
    transcript = Transcript(conversation.messages, counter_for_model("gpt-4o-mini"), conversation.meta)
    target = int(proxy_settings.compact_to * window)

    assert removed(offloading, transcript, target, off=False) <= removed(offloading, transcript, target, off=True)
