"""What every compaction strategy is: given a transcript and a target, an edit plan or None."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import ClassVar

from proxy.engine.grouping import keeps_protected, protected_indices
from proxy.engine.plan import Created, EditPlan, Entry, Kept
from proxy.engine.transcript import Transcript


class Strategy(ABC):
    """A way of making a conversation smaller.

    Every strategy keeps the engine's invariants: the leading block (instructions and the context a client states up
    front, see `proxy.engine.grouping`) and the latest real user message survive byte for byte, never cut, dropped
    or summarized (a plan that would change them is refused, see `shrinking`), tool calls and their results are kept
    or removed together, the input is never mutated, and `plan` returns None
    unless the conversation gets smaller. `target_tokens` is a goal, not a guarantee: a strategy that cannot reach it
    gets as close as its rules allow.
    """

    name: ClassVar[str]

    def plan(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        """An edit plan that brings `transcript` toward `target_tokens` message tokens, or None.

        None when the transcript is already at or under the target, when there is nothing this strategy may change,
        or when its changes would not make the conversation smaller.
        """
        if transcript.total() <= target_tokens:
            return None
        return shrinking(transcript, self._propose(transcript, target_tokens))

    @abstractmethod
    def _propose(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        """The strategy's own plan for an over-target transcript, before the shrinkage check."""


def replace_until_target(
    transcript: Transcript,
    target_tokens: int,
    candidates: Iterable[int],
    stand_in: Callable[[int, int], Created | None],
    along: Callable[[int], Iterable[Created]] | None = None,
) -> EditPlan | None:
    """Replace messages one at a time, in the order of `candidates`, until the transcript fits `target_tokens`.

    The protected messages (`protected_indices`: the leading block and the latest real user message) are passed
    over whatever the candidates say.

    :param stand_in: Given a message's index and how many tokens the transcript is still over, the message to put in
        its place, or None to leave it. A stand-in that saves nothing is not used.
    :param along: Given the index of a message just replaced, the replacements of other messages that must go with it
        (each `Created` names the message it `replaces`), whatever they save.
    :returns: The plan with every replacement made, or None when none was.
    """
    current = transcript.total()
    entries: list[Entry] = [Kept(index) for index in range(len(transcript))]
    protected = protected_indices(transcript)
    changed = False
    for index in candidates:
        excess = current - target_tokens
        if excess <= 0:
            break
        if index in protected:
            continue
        replacement = stand_in(index, excess)
        if replacement is None:
            continue
        saved = transcript.tokens(index) - transcript.counter.message_tokens(replacement.message)
        if saved <= 0:
            continue
        entries[index] = replacement
        current -= saved
        changed = True
        for companion in along(index) if along is not None else ():
            if companion.replaces is not None:
                entries[companion.replaces] = companion
                current += transcript.counter.message_tokens(companion.message) - transcript.tokens(companion.replaces)
    return EditPlan(len(transcript), tuple(entries)) if changed else None


def shrinking(transcript: Transcript, plan: EditPlan | None) -> EditPlan | None:
    """`plan` if it makes the transcript smaller and keeps the protected messages as they are, else None.

    Every strategy's plan passes here, which is what makes the protected messages the same for all of them.
    """
    if plan is None or plan.is_identity or not keeps_protected(transcript, plan):
        return None
    return plan if transcript.edited(plan).total() < transcript.total() else None
