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


class KeepingMore(CompactionChain):
    """A chain preferred unless another keeps more of the conversation: offloading that never loses more than pruning.

    Offloading leaves a reference with a digest where pruning leaves a shorter placeholder, so in a small window the
    preferred chain may have to drop whole turns that the other would keep. Each compaction runs the preferred chain;
    when its plan removed messages, the other runs too, and its plan is taken if it removes fewer while reaching the
    target (or getting at least as small). Ties go to the preferred chain.

    :param preferred: The chain used whenever it costs no more of the conversation (`strategies` are its own).
    :param fallback: The chain tried when the preferred one removed messages.
    """

    def __init__(self, preferred: CompactionChain, fallback: CompactionChain) -> None:
        super().__init__(preferred.strategies)
        self.preferred = preferred
        self.fallback = fallback

    def compact(self, transcript: Transcript, target_tokens: int) -> CompactionResult | None:
        """The preferred chain's result, or the fallback's when it keeps more (see the class docstring)."""
        first = self.preferred.compact(transcript, target_tokens)
        if first is None or not first.plan.removed_count():
            return first
        return _keeping_more(first, self.fallback.compact(transcript, target_tokens), target_tokens)

    async def compact_async(self, transcript: Transcript, target_tokens: int) -> CompactionResult | None:
        """Like `compact`, awaiting strategies that do I/O."""
        first = await self.preferred.compact_async(transcript, target_tokens)
        if first is None or not first.plan.removed_count():
            return first
        return _keeping_more(first, await self.fallback.compact_async(transcript, target_tokens), target_tokens)


def _keeping_more(first: CompactionResult, other: CompactionResult | None, target_tokens: int) -> CompactionResult:
    """`other` if it removes fewer messages than `first` and reaches the target as well, else `first`."""
    if other is None or other.plan.removed_count() >= first.plan.removed_count():
        return first
    return other if other.tokens_after <= first.tokens_after or _reaches(other, target_tokens) else first


def _reaches(result: CompactionResult, target_tokens: int) -> bool:
    """Whether what `result` kept fits `target_tokens`: an inserted note or summary comes on top, as in Haystack."""
    counter = result.compacted.counter
    inserted = sum(counter.message_tokens(entry.message) for entry in result.plan.created() if entry.replaces is None)
    return result.tokens_after - inserted <= target_tokens


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
