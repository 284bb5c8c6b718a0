"""The leading block and the latest user message reach the output byte for byte: every chain, target and replay.

The leading block is the system and developer messages a conversation opens with, and the context a client states
up front in user messages of its own (Codex CLI's `<environment_context>`, `<user_instructions>`, AGENTS.md). No
strategy, in any order the registry allows, at any target, may cut, drop or summarize it, neither on the first
compaction nor on a later one over the marked output of the first. (Replays: `tests/pipeline/test_replayed_block.py`.)

The block is stated here on its own, as the README states it, not taken from the engine's definition.
"""

from __future__ import annotations

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.engine import (
    COMPACTION_META_KEY,
    ApproximateCounter,
    CompactionChain,
    EditPlan,
    MemoryOffloadStore,
    Strategy,
    SummaryRequest,
    ToolResultOffload,
    Transcript,
)
from proxy.engine.messages import Message
from proxy.engine.strategies.registry import STRATEGY_NAMES, strategy_by_name
from tests.engine.conversations import Conversation, assert_tool_pairs_intact, conversations
from tests.support.examples import examples

COUNTER = ApproximateCounter()
OFFLOAD = ToolResultOffload.name
POOL = (*STRATEGY_NAMES, OFFLOAD)
"""Every strategy the registry names, and offloading (which the proxy adds to the chain itself)."""

CHECKS = settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])


class RecordingSummarizer:
    """A deterministic summarizer that remembers what it was asked to summarize."""

    def __init__(self) -> None:
        self.requests: list[SummaryRequest] = []

    def summarize(self, request: SummaryRequest) -> str:
        self.requests.append(request)
        return f"{len(request.indices)} messages about the task."

    async def summarize_async(self, request: SummaryRequest) -> str:
        return self.summarize(request)


def _chain(names: list[str], summarizer: RecordingSummarizer) -> CompactionChain:
    strategies: list[Strategy] = [
        ToolResultOffload(MemoryOffloadStore()) if name == OFFLOAD else strategy_by_name(name, summarizer)
        for name in names
    ]
    return CompactionChain(strategies)


CONTEXT_OPENINGS = ("<environment_context>", "<user_instructions>", "# AGENTS.md instructions")


def _opening(message: Message) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = next((part["text"] for part in content if part.get("type") == "text"), "")
    return content.lstrip() if isinstance(content, str) else ""


def _is_marked(meta: dict[str, object]) -> bool:
    return COMPACTION_META_KEY in meta


def block_end(messages: list[Message], meta: list[dict[str, object]] | None = None) -> int:
    """Where the leading block ends: system and developer messages, and user messages stating the client's context."""
    for index, message in enumerate(messages):
        context = message["role"] == "user" and _opening(message).startswith(CONTEXT_OPENINGS)
        if (meta and _is_marked(meta[index])) or not (message["role"] in ("system", "developer") or context):
            return index
    return len(messages)


def latest_user(messages: list[Message], meta: list[dict[str, object]]) -> int | None:
    """The latest user message after the block that compaction did not make."""
    start = block_end(messages, meta)
    users = [i for i in range(start, len(messages)) if messages[i]["role"] == "user" and not _is_marked(meta[i])]
    return users[-1] if users else None


def _dumped(messages: list[Message]) -> list[bytes]:
    return [orjson.dumps(message) for message in messages]


def _assert_protected(original: list[Message], output: list[Message], task: int | None) -> None:
    """The leading block opens the output byte for byte, and the latest user message is in it byte for byte."""
    end = block_end(original)
    assert _dumped(output[:end]) == _dumped(original[:end]), "the leading block changed"
    if task is not None:
        assert orjson.dumps(original[task]) in _dumped(output), "the latest user message changed or went"


def _never_summarized(summarizer: RecordingSummarizer) -> None:
    for request in summarizer.requests:
        view, meta = list(request.transcript.messages), [dict(entry) for entry in request.transcript.meta]
        protected = set(range(block_end(view, meta)))
        task = latest_user(view, meta)
        assert not protected & set(request.indices), "the leading block was summarized"
        assert task not in request.indices, "the latest user message was summarized"


@CHECKS
@given(
    conversation=conversations(instruction_words=900, client_context=True, checkpoints=True),
    names=st.permutations(POOL).flatmap(lambda order: st.integers(1, len(order)).map(lambda n: list(order[:n]))),
    first=st.floats(min_value=0.0, max_value=1.2),
    second=st.floats(min_value=0.0, max_value=1.2),
)
def test_the_leading_block_is_byte_identical_in_every_plan(
    conversation: Conversation, names: list[str], first: float, second: float
) -> None:
    messages, summarizer = conversation.messages, RecordingSummarizer()
    transcript = Transcript(messages, COUNTER, conversation.meta)
    task = latest_user(messages, conversation.meta)
    result = _chain(names, summarizer).compact(transcript, int(transcript.total() * first))
    plan = result.plan if result is not None else EditPlan.identity(len(messages))
    _assert_protected(messages, plan.apply_messages(messages), task)

    # The next turn: the model answered and the user asked again; the client re-sent everything, the compacted
    # view (its markers included) is compacted once more and the plans compose, as the proxy's rewrite memory does.
    grown: list[Message] = [*messages, {"role": "assistant", "content": "done"}, {"role": "user", "content": "next"}]
    view = result.compacted if result is not None else transcript
    later = Transcript([*view.messages, *grown[len(messages) :]], COUNTER, [*view.meta, {}, {}])
    again = _chain(names, summarizer).compact(later, int(later.total() * second))
    composed = plan.extended(len(grown))
    if again is not None:
        composed = composed.then(again.plan)
    output = composed.apply_messages(grown)
    _assert_protected(grown, output, len(grown) - 1)
    assert_tool_pairs_intact(output)
    _never_summarized(summarizer)
