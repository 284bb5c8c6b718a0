"""Running the compaction a decision calls for: a summary first when one is configured, then the chain.

Below the trigger, a conversation past `precompact_at` has the summary its next compaction needs started in the
background, so it is ready when the trigger is reached. For a client that compacts itself the trigger is the room
the reply leaves (`Thresholds.client_compacts`), and so is the point from which a summary is written ahead: none is
paid for while the client's own compaction keeps it inside the window.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TypeVar

from proxy.engine import (
    CompactionChain,
    CompactionResult,
    Outcome,
    Room,
    Summarization,
    ToolResultOffload,
    decide,
    decision_room,
)
from proxy.names import shown
from proxy.pipeline.measured import Measured
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.summaries import Summaries, SummaryContext

logger = logging.getLogger("compaction_proxy.compaction")

T = TypeVar("T")

_ROOM_LOGS = {
    Room.OVER_TARGET: "The leading instructions and the tools alone leave no room under the compaction target; the "
    "rest of the conversation was compacted as far as the rules allow.",
    Room.OVER_WINDOW: "The leading instructions and the tools alone exceed the context window; the request is "
    "forwarded as it came, since no compaction may touch them.",
}

Work = Callable[[Callable[[], T]], Awaitable[T]]
"""Runs CPU work proportional to the whole request (off the event loop when it is large)."""


class Compacting:
    """The proxy's compaction step: the summaries that go before the request's chain.

    :param summaries: The summaries, when `summarization` is configured and the mode acts on decisions.
    :param summary_start_at: The fraction of the window from which a summary is written ahead (`precompact_at`).
    """

    def __init__(self, summaries: Summaries | None, summary_start_at: float) -> None:
        self.summaries = summaries
        self.summary_start_at = summary_start_at

    async def outcome(
        self,
        measured: Measured,
        context: SummaryContext,
        work: Work[CompactionResult | None],
        chain: CompactionChain,
    ) -> Outcome:
        """Compact with `chain` when the decision says so (see the module docstring).

        Not when the leading block and the tools alone exceed the window (`Room.OVER_WINDOW`): nothing compaction
        may touch would make the request fit.
        """
        transcript, decision = measured.compaction_transcript, measured.decision
        summaries = self.summaries
        if not decision.compact:
            if summaries is not None:
                self._summarize_ahead(summaries, measured, context)
            return Outcome(decision)
        room = decision_room(transcript, decision, measured.thresholds)
        if room is Room.OVER_WINDOW:
            return Outcome(decision, room=room)
        summary = await summaries.plan(context, transcript, decision.target_tokens) if summaries else None
        if summary is None:
            return Outcome(decision, await work(lambda: chain.compact(transcript, decision.target_tokens)), room)
        summarized = transcript.edited(summary)
        rest = await work(lambda: chain.compact(summarized, decision.target_tokens))
        result = CompactionResult(
            plan=summary if rest is None else summary.then(rest.plan),
            compacted=summarized if rest is None else rest.compacted,
            tokens_before=transcript.total(),
            tokens_after=summarized.total() if rest is None else rest.tokens_after,
            strategies=(Summarization.name, *(rest.strategies if rest else ())),
        )
        return Outcome(decision, result, room)

    def _summarize_ahead(self, summaries: Summaries, measured: Measured, context: SummaryContext) -> None:
        """Start the next compaction's summary once the conversation passes `precompact_at` of the window."""
        ahead = replace(measured.thresholds, compact_at=self.summary_start_at)
        if measured.decision.estimated_tokens < ahead.trigger_tokens:
            return
        early = decide(ahead, measured.transcript, measured.overhead, measured.anchor, measured.decision.scale)
        if early.compact:
            growth = max(measured.thresholds.trigger_tokens - early.estimated_tokens, 0) / early.scale
            summaries.start(context, measured.transcript, early.target_tokens, growth_tokens=int(growth))


def chain_names(strategies: list[str]) -> list[str]:
    """The strategies the chain runs.

    Summarization is the proxy's own step before the chain, offloading joins it per request
    (`proxy.pipeline.offload.offloading`), and middle-out is the fallback when nothing else is named.
    """
    names = [name for name in strategies if name not in (Summarization.name, ToolResultOffload.name)]
    return names or ["middle_out"]


def report_room(room: Room | None, metrics: CompactionMetrics, model: str | None, window: int) -> None:
    """Count and log (one line, no content) that the leading block and the tools leave no room (see `Room`)."""
    if room is None:
        return
    metrics.instructions_room.labels(room.name.lower()).inc()
    logger.warning(_ROOM_LOGS[room], extra={"model": shown(model), "context_window": window})
