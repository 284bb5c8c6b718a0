"""An ordered chain of strategies: each runs only while the conversation is still over the target."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.engine.plan import EditPlan
from proxy.engine.strategies.base import Strategy
from proxy.engine.strategies.references import dangling_references
from proxy.engine.transcript import Transcript


@dataclass(frozen=True)
class CompactionResult:
    """What a chain did.

    :param plan: The combined edit plan over the input transcript.
    :param compacted: The transcript the plan produces.
    :param tokens_before: Message tokens before compaction.
    :param tokens_after: Message tokens after compaction.
    :param strategies: The strategies that changed something, in the order they ran.
    """

    plan: EditPlan
    compacted: Transcript
    tokens_before: int
    tokens_after: int
    strategies: tuple[str, ...]


class CompactionChain:
    """Runs strategies in order, each on the previous one's output, until the conversation fits the target.

    A typical chain prunes tool results first (cheap, keeps the shape), then slides the window (drops whole
    turns), then summarizes or cuts the middle out of one oversized message as the last resort.

    :raises ValueError: If `strategies` is empty.
    """

    def __init__(self, strategies: Sequence[Strategy]) -> None:
        if not strategies:
            raise ValueError("A compaction chain needs at least one strategy.")
        self.strategies = tuple(strategies)

    def compact(self, transcript: Transcript, target_tokens: int) -> CompactionResult | None:
        """Compact `transcript` toward `target_tokens` message tokens; None when no strategy changed anything."""
        run = _ChainRun(transcript)
        for strategy in self.strategies:
            if run.current.total() <= target_tokens:
                break
            run.record(strategy, strategy.plan(run.current, target_tokens))
        return run.result()

    async def compact_async(self, transcript: Transcript, target_tokens: int) -> CompactionResult | None:
        """Like `compact`, awaiting strategies that do I/O (summarization)."""
        run = _ChainRun(transcript)
        for strategy in self.strategies:
            if run.current.total() <= target_tokens:
                break
            plan_async = getattr(strategy, "plan_async", None)
            plan = (
                await plan_async(run.current, target_tokens)
                if plan_async
                else strategy.plan(run.current, target_tokens)
            )
            run.record(strategy, plan)
        return run.result()


class _ChainRun:
    """The running state of one pass through a chain."""

    def __init__(self, transcript: Transcript) -> None:
        self.source = transcript
        self.current = transcript
        self.plan: EditPlan | None = None
        self.applied: list[str] = []

    def record(self, strategy: Strategy, plan: EditPlan | None) -> None:
        if plan is None:
            return
        edited = self.current.edited(plan)
        # A reference to a result this strategy took away would point to nothing: it gives way to a placeholder.
        repair = dangling_references(edited, strategy.name)
        if repair is not None:
            plan = plan.then(repair)
            edited = edited.edited(repair)
        self.plan = plan if self.plan is None else self.plan.then(plan)
        self.current = edited
        self.applied.append(strategy.name)

    def result(self) -> CompactionResult | None:
        if self.plan is None:
            return None
        return CompactionResult(
            plan=self.plan,
            compacted=self.current,
            tokens_before=self.source.total(),
            tokens_after=self.current.total(),
            strategies=tuple(self.applied),
        )
