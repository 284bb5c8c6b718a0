"""Sliding window: keep the instructions, the current task, and as much complete recent conversation as fits."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.engine.grouping import (
    current_step_groups,
    flatten,
    historical_turn_groups,
    latest_user_index,
    leading_instructions_end,
    newest_that_fit,
)
from proxy.engine.plan import EditPlan, Entry, Kept
from proxy.engine.strategies.base import Strategy
from proxy.engine.transcript import Transcript, created

NUM_REMOVED_PLACEHOLDER = "{num_removed}"

DEFAULT_OMISSION_NOTE = "[{num_removed} earlier messages were removed to free up context; they cannot be recovered.]"


@dataclass(frozen=True)
class _Split:
    """Which turns and steps survive, and where the omission note goes."""

    kept: list[int]
    removed: list[int]
    note_position: int


class SlidingWindow(Strategy):
    """Drops the oldest complete turns, then the current task's oldest steps, until the rest fits the target.

    Leading instructions and the latest real user message are always kept. Historical turns are kept whole, newest
    first, while they fit; if the current task alone is over budget, every historical turn goes and the task's oldest
    Agent steps follow, always keeping the newest `min_keep_steps`. One omission note stands where the removed
    messages were: after the instructions when only history went, after the task's user message when steps went. The
    kept messages alone fill the target and the note comes on top of it, which is how Haystack's compactor chooses. A
    later compaction folds an earlier note into its own, so there is never more than one.

    :param min_keep_steps: The fewest complete recent Agent steps kept even when they exceed the target. 0 allows
        all of the current task's steps to go.
    :param omission_note: The user message left in place of what was removed (`{num_removed}` is substituted), or
        None to remove silently.
    :raises ValueError: If `min_keep_steps` is negative.
    """

    name = "sliding_window"

    def __init__(self, *, min_keep_steps: int = 1, omission_note: str | None = DEFAULT_OMISSION_NOTE) -> None:
        if min_keep_steps < 0:
            raise ValueError(f"`min_keep_steps` must be at least 0, got {min_keep_steps}.")
        self.min_keep_steps = min_keep_steps
        self.omission_note = omission_note

    def _propose(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        split = self._split(transcript, target_tokens)
        if not split.removed or all(self._is_note(transcript, index) for index in split.removed):
            # Swapping an earlier note for a new one frees nothing.
            return None
        entries: list[Entry] = [Kept(index) for index in split.kept]
        note = self._note(len(split.removed))
        if note:
            marked = created(note, self.name, removed_messages=len(split.removed), kept_messages=len(split.kept))
            entries.insert(split.note_position, marked)
        return EditPlan(len(transcript), tuple(entries))

    def _note(self, num_removed: int) -> dict[str, str] | None:
        if not self.omission_note:
            return None
        return {"role": "user", "content": self.omission_note.replace(NUM_REMOVED_PLACEHOLDER, str(num_removed))}

    def _is_note(self, transcript: Transcript, index: int) -> bool:
        return transcript.role(index) == "user" and transcript.created_by(index, self.name)

    def _split(self, transcript: Transcript, target_tokens: int) -> _Split:
        instructions_end = leading_instructions_end(transcript)
        task_index = latest_user_index(transcript)
        task = [task_index] if task_index is not None else []
        # An earlier note is left out of its turn, so keeping the turn folds that note into this compaction's note.
        turns = [
            [index for index in group if not self._is_note(transcript, index)]
            for group in historical_turn_groups(transcript, instructions_end, task_index)
        ]
        steps = current_step_groups(transcript, instructions_end, task_index)
        # The kept messages fill the target and the note comes on top, as in Haystack: reserving room for the note
        # would drop one more turn or step than Haystack does at a tight target.
        budget = target_tokens - transcript.tokens_of([*range(instructions_end), *task])

        task_tokens = transcript.tokens_of(flatten(steps))
        if task_tokens > budget:
            # The current task alone is over budget: all history goes, then the task's oldest steps.
            first_turn = len(turns)
            first_step = min(newest_that_fit(transcript, steps, budget), max(len(steps) - self.min_keep_steps, 0))
        else:
            first_turn = newest_that_fit(transcript, turns, budget - task_tokens)
            first_step = 0

        kept_turns = flatten(turns[first_turn:])
        kept = [*range(instructions_end), *kept_turns, *task, *flatten(steps[first_step:])]
        kept_set = set(kept)
        note_position = instructions_end if first_step == 0 else instructions_end + len(kept_turns) + len(task)
        return _Split(kept, [index for index in range(len(transcript)) if index not in kept_set], note_position)
