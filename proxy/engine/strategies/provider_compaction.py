"""Provider compaction: what a provider's own compaction item already carries is dropped, losing nothing.

A provider that compacts on its side (OpenAI's Responses API with `context_management`, or its `/responses/compact`)
hands back an opaque compaction item that stands for everything before it. A client that keeps sending the whole
history still sends what that item replaced; the provider documents that it can go. The front end marks such an
item as a checkpoint (`proxy.engine.messages.CHECKPOINT`); this strategy drops everything between the leading
instructions and the latest checkpoint, the cheapest and only lossless first step.
"""

from __future__ import annotations

from collections.abc import Hashable

from proxy.engine.grouping import latest_user_index, leading_instructions_end
from proxy.engine.messages import is_checkpoint, is_tool_result, tool_calls_of
from proxy.engine.plan import EditPlan, Kept
from proxy.engine.strategies.base import Strategy
from proxy.engine.transcript import Transcript


class ProviderCompaction(Strategy):
    """Drops the messages a later provider compaction item stands for (see the module docstring).

    The latest real user message stays even when the checkpoint follows it (as every strategy keeps it), and nothing
    is dropped when a message after the checkpoint answers a call made before it: removing the call would orphan its
    result, so such a conversation is left to the other strategies.
    """

    name = "provider_compaction"

    def _propose(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        checkpoint = _latest_checkpoint(transcript)
        start = leading_instructions_end(transcript)
        if checkpoint is None or checkpoint <= start or _answers_earlier_calls(transcript, start, checkpoint):
            return None
        task = latest_user_index(transcript)
        kept_task = [task] if task is not None and start <= task < checkpoint else []
        kept = [*range(start), *kept_task, *range(checkpoint, len(transcript))]
        return EditPlan(len(transcript), tuple(Kept(index) for index in kept))


def _latest_checkpoint(transcript: Transcript) -> int | None:
    for index in reversed(range(len(transcript))):
        if is_checkpoint(transcript.messages[index]):
            return index
    return None


def _answers_earlier_calls(transcript: Transcript, start: int, checkpoint: int) -> bool:
    """Whether a tool result from `checkpoint` on answers a call made in `[start, checkpoint)`."""
    dropped: set[Hashable] = set()
    for index in range(start, checkpoint):
        for call in tool_calls_of(transcript.messages[index]):
            call_id = call.get("id")
            if isinstance(call_id, Hashable):
                dropped.add(call_id)
    for index in range(checkpoint, len(transcript)):
        message = transcript.messages[index]
        call_id = message.get("tool_call_id")
        if is_tool_result(message) and isinstance(call_id, Hashable) and call_id in dropped:
            return True
    return False
