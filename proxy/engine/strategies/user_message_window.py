"""User message window: a sliding window that keeps what the user said and lets the rest of old turns go."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.engine.grouping import (
    Group,
    agent_step_groups,
    current_step_groups,
    flatten,
    latest_user_index,
    leading_instructions_end,
    newest_that_fit,
)
from proxy.engine.plan import COMPACTION_META_KEY, Created, EditPlan, Entry, Kept
from proxy.engine.strategies.base import Strategy
from proxy.engine.strategies.middle_out import DEFAULT_NOTICE, MiddleOut, cut_middle_out
from proxy.engine.strategies.offload import OFFLOADED_META_KEY, OffloadStore, ToolResultOffload
from proxy.engine.strategies.sliding_window import SlidingWindow
from proxy.engine.transcript import Transcript, created

DEFAULT_USER_TEXT_SHARE = 0.8
"""The share of the target the user's earlier messages may take by default, chosen with `python -m bench.recall`.

A cap, not a reservation: room the user's words leave goes to the rest. From 0.6 on every requirement and correction
was kept and the bill stayed at or under that of the chain that kept none (their block is the stable, cached opening
of every request after a compaction); lower shares kept more tool output and decisions but billed more (see
docs/benchmarks-retention.md).
"""

DEFAULT_USER_POINTER = (
    "[User message offloaded ({characters} characters) under reference '{reference}'. It opens: {preview}]"
)
"""What stands in for an offloaded user message (`{characters}`, `{reference}`, `{preview}` substituted)."""

NUM_REMOVED_PLACEHOLDER = "{num_removed}"
NUM_REMOVED_USER_PLACEHOLDER = "{num_removed_user}"

DEFAULT_OMISSION_NOTE = (
    "[Earlier assistant and tool messages were removed to free up context, and {num_removed_user} of the user's"
    " earlier messages; they cannot be recovered. The user's other messages are kept as they wrote them.]"
)

_LONGEST_COUNT = 999_999_999
"""A count as long as any the note can give (earlier notes' counts add up), for the room it is given."""

_CUT_MARKERS = frozenset({MiddleOut.name})
"""Strategies besides this one whose cut-down user message still holds the user's words (head and tail)."""


@dataclass(frozen=True)
class _History:
    """The conversation before the current task, sorted by what happens to it.

    :param users: The user's messages, oldest first.
    :param units: Everything else but earlier notes (`_with_note` folds those), in units removed whole (what one turn
        holds besides the user's message), oldest first.
    """

    users: list[int]
    units: list[Group]


@dataclass
class _Words:
    """What is kept of the user's earlier messages: each one as it is (`Kept`) or cut down (`Created`)."""

    kept: dict[int, Entry] = field(default_factory=dict)
    removed: list[int] = field(default_factory=list)
    tokens: int = 0

    @property
    def shortened(self) -> bool:
        """Whether any message was cut or removed."""
        return bool(self.removed) or any(not isinstance(entry, Kept) for entry in self.kept.values())


class UserMessageWindow(Strategy):
    """Keeps the user's own messages, and drops the oldest assistant and tool messages until the rest fits the target.

    The user's words are the spec of the work: a requirement stated in the first message, or a change of direction in
    the middle, must outlive the tool output and the prose that followed it. The policy, in order:

    - The leading instructions and the latest real user message (the current task) are always kept.
    - The user's earlier messages (role `user`, the user's text: not tool results, not notes or summaries compaction
      made) are kept byte for byte while together they fit `user_text_share` of the target, and leave room for the
      newest `min_keep_steps` steps of the current task. Over that, the longest (a pasted log or document) are cut
      middle-out, largest first and each by what is still over, never below `min_user_message_tokens`, keeping how
      each opens and closes; only if that is not enough are whole messages removed: those in the middle first,
      oldest first, then the latest `latest_user_messages`, and the opening `opening_user_messages` (where a task
      and its requirements are stated) last of all.
    - The current task's Agent steps are kept, oldest going first when they do not fit, always keeping the newest
      `min_keep_steps`.
    - The rest of the earlier turns (assistant prose and reasoning, tool calls with all their results, summaries)
      fills what is left, newest turn first, each turn's share as one (whole Agent steps, never split), stopping at
      the first that does not fit.
    - What all that leaves unused goes back to the user's words that were over their share: cut less, or removed
      fewer.

    One omission note says that assistant and tool messages went, and how many user messages: where the first of
    them was (or where an earlier note stood), so the instructions and the user's opening messages before it stay
    the prefix the provider has cached; after the task's user message when steps of the task went. Its default text
    carries no count that changes from one compaction to the next, for the same reason. The note is counted within the
    target (unlike `SlidingWindow`'s, which comes on top), so a chain's next strategy has nothing left to do; a later
    compaction folds an earlier note (its own or the sliding window's) into its own, so there is never more than
    one. Whenever `SlidingWindow` gets within its note of the target, this gets within the target.

    With a `store`, a user message that must go is offloaded behind a reference the model can read back, and a short
    stand-in takes its place; a stand-in is one of the user's messages thereafter. Reading it back takes a tool the
    request may not have had: when a compaction offloads one, it is made again within the target less
    `reserved_tokens`, what the tool adds to the request, so the request with the tool still fits. A compaction that
    offloads none reserves nothing: it decides as if `reserved_tokens` were 0.

    :param user_text_share: The share of the target the user's earlier messages may take, between 0 and 1 (see
        `DEFAULT_USER_TEXT_SHARE`).
    :param min_keep_steps: The fewest complete recent Agent steps of the current task kept even over the target.
    :param min_user_message_tokens: The size below which no user message is cut: past it, messages are removed.
    :param opening_user_messages: How many of the user's first messages are the last to be removed.
    :param latest_user_messages: How many of the user's latest earlier messages are removed just before those.
    :param omission_note: The user message left in place of what was removed (`{num_removed}` assistant and tool
        messages, `{num_removed_user}` user messages are substituted).
    :param store: Where a user message that must go is offloaded, leaving a stand-in with its reference (readable back
        through the proxy's read tool) instead of being removed; None removes it.
    :param pointer: The stand-in's text (`{characters}`, `{reference}` and `{preview}` are substituted).
    :param reserved_tokens: What the request grows by once it holds a stand-in (the read tool's declaration), taken
        off the target of a compaction that offloads a user message.
    :raises ValueError: If `user_text_share` is outside [0, 1] or a count is negative.
    """

    name = "user_message_window"

    def __init__(
        self,
        *,
        user_text_share: float = DEFAULT_USER_TEXT_SHARE,
        min_keep_steps: int = 1,
        min_user_message_tokens: int = 512,
        opening_user_messages: int = 2,
        latest_user_messages: int = 2,
        omission_note: str = DEFAULT_OMISSION_NOTE,
        store: OffloadStore | None = None,
        pointer: str = DEFAULT_USER_POINTER,
        reserved_tokens: int = 0,
    ) -> None:
        if not 0 <= user_text_share <= 1:
            raise ValueError(f"`user_text_share` must be between 0 and 1, got {user_text_share}.")
        counts = {
            "min_keep_steps": min_keep_steps,
            "min_user_message_tokens": min_user_message_tokens,
            "opening_user_messages": opening_user_messages,
            "latest_user_messages": latest_user_messages,
            "reserved_tokens": reserved_tokens,
        }
        for setting, value in counts.items():
            if value < 0:
                raise ValueError(f"`{setting}` must be at least 0, got {value}.")
        self.user_text_share = user_text_share
        self.min_keep_steps = min_keep_steps
        self.min_user_message_tokens = min_user_message_tokens
        self.opening_user_messages = opening_user_messages
        self.latest_user_messages = latest_user_messages
        self.omission_note = omission_note
        self.store = store
        self.pointer = pointer
        self.reserved_tokens = reserved_tokens
        self._offload = None if store is None else ToolResultOffload(store, pointer=pointer)

    def offloading_to(
        self, store: OffloadStore, pointer: str = DEFAULT_USER_POINTER, reserved_tokens: int = 0
    ) -> UserMessageWindow:
        """The same window, offloading the user messages it must set aside to `store` (one request's, say)."""
        if reserved_tokens < 0:
            raise ValueError(f"`reserved_tokens` must be at least 0, got {reserved_tokens}.")
        offloading = copy.copy(self)
        offloading.store, offloading.pointer, offloading.reserved_tokens = store, pointer, reserved_tokens
        offloading._offload = ToolResultOffload(store, pointer=pointer)
        return offloading

    def _propose(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        plan = self._plan(transcript, target_tokens)
        if self.reserved_tokens and any(self._offloads(entry) for entry in plan.created()):
            # The read tool comes with the stand-ins: its tokens are taken off the target only when it comes.
            plan = self._plan(transcript, target_tokens - self.reserved_tokens)
        return plan

    def _offloads(self, entry: Created) -> bool:
        """Whether `entry` is a stand-in for a user message this compaction offloaded."""
        marker = entry.meta.get(COMPACTION_META_KEY)
        return entry.strategy == self.name and isinstance(marker, Mapping) and marker.get("offloaded") is True

    def _plan(self, transcript: Transcript, target_tokens: int) -> EditPlan:
        """The plan within `target_tokens` (see the class docstring)."""
        instructions_end = leading_instructions_end(transcript)
        task_index = latest_user_index(transcript)
        task = [] if task_index is None else [task_index]
        history = self._history(transcript, instructions_end, task_index)
        steps = current_step_groups(transcript, instructions_end, task_index)
        # The note is counted in: one left on top would set the next strategy of the chain going (the sliding window
        # would drop turns, the user's words with them, to make room for it).
        note = self._note_message(_LONGEST_COUNT, _LONGEST_COUNT)
        budget = target_tokens - transcript.tokens_of([*range(instructions_end), *task])
        budget -= transcript.counter.message_tokens(note)
        kept_steps = min(self.min_keep_steps, len(steps))
        needed = transcript.tokens_of(flatten(steps[len(steps) - kept_steps :]))
        user_room = min(int(self.user_text_share * target_tokens), budget - needed)
        words = self._fit_words(transcript, history.users, user_room)

        room = budget - words.tokens
        task_tokens = transcript.tokens_of(flatten(steps))
        if task_tokens > room:
            first_step = min(newest_that_fit(transcript, steps, room), len(steps) - kept_steps)
            first_unit = len(history.units)
        else:
            first_step = 0
            first_unit = newest_that_fit(transcript, history.units, room - task_tokens)
        kept_units = set(flatten(history.units[first_unit:]))
        left = room - transcript.tokens_of([*flatten(steps[first_step:]), *kept_units])
        if left > 0 and words.shortened:
            # What the rest left unused goes back to the user's words: cut less, or remove fewer.
            words = self._fit_words(transcript, history.users, words.tokens + left)

        entries: list[Entry] = [Kept(index) for index in range(instructions_end)]
        for index in range(instructions_end, task[0] if task else instructions_end):
            if index in words.kept:
                entries.append(words.kept[index])
            elif index in kept_units:
                entries.append(Kept(index))
        entries += [Kept(index) for index in [*task, *flatten(steps[first_step:])]]
        note_position = None if first_step == 0 else len(entries) - len(flatten(steps[first_step:]))
        return self._with_note(transcript, entries, words, note_position)

    def _with_note(self, transcript: Transcript, entries: list[Entry], words: _Words, position: int | None) -> EditPlan:
        """The plan of `entries`, with one note at `position` for what they leave out, earlier notes folded in.

        With `position` None the note stands where the earliest of them was (an earlier note, or the first message
        removed), so what comes before it, the instructions and the user's opening messages, stays the prefix the
        provider has cached. When they leave out nothing but earlier notes, those stay where they were and no note is
        added.
        """
        present = {entry.index if isinstance(entry, Kept) else entry.replaces for entry in entries}
        notes = [index for index in range(len(transcript)) if index not in present and self._is_note(transcript, index)]
        missing = [index for index in range(len(transcript)) if index not in present and index not in notes]
        if not missing:
            # Swapping an earlier note for a new one frees nothing: the notes stay where they were, with any cuts.
            return EditPlan(len(transcript), tuple(sorted([*entries, *map(Kept, notes)], key=_source_position)))
        users = len(words.removed)
        others = len(missing) - users
        for index in notes:
            marker = transcript.marker(index) or {}
            others += _count(marker, "removed_messages")
            users += _count(marker, "removed_user_messages")
        note = created(
            self._note_message(others, users),
            self.name,
            removed_messages=others,
            removed_user_messages=users,
            kept_messages=len(entries),
        )
        if position is None:
            first = min([*notes, *missing])
            position = sum(1 for entry in entries if _source_position(entry) < first)
        return EditPlan(len(transcript), (*entries[:position], note, *entries[position:]))

    def _note_message(self, others: int, users: int) -> dict[str, str]:
        text = self.omission_note.replace(NUM_REMOVED_PLACEHOLDER, str(others))
        return {"role": "user", "content": text.replace(NUM_REMOVED_USER_PLACEHOLDER, str(users))}

    def _history(self, transcript: Transcript, start: int, task_index: int | None) -> _History:
        """The messages between the instructions and the task, sorted by `_History`'s kinds."""
        end = start if task_index is None else task_index
        users = [index for index in range(start, end) if self._is_user_words(transcript, index)]
        notes = {index for index in range(start, end) if self._is_note(transcript, index)}
        steps = agent_step_groups(transcript, start, end)
        taken = {*users, *notes, *flatten(steps)}
        singles = [[index] for index in range(start, end) if index not in taken]
        return _History(users, _by_turn(sorted([*steps, *singles]), users))

    def _is_note(self, transcript: Transcript, index: int) -> bool:
        """Whether the message at `index` is an omission note this strategy or the sliding window left.

        The sliding window's is folded in too, so a conversation holds one note whichever window wrote the last; its
        count (of messages of any kind) joins the assistant and tool messages'.
        """
        if transcript.role(index) != "user" or self._is_user_words(transcript, index):
            return False
        return transcript.created_by(index, self.name) or transcript.created_by(index, SlidingWindow.name)

    def _is_user_words(self, transcript: Transcript, index: int) -> bool:
        """Whether the message at `index` is the user's own: as written, or cut down with its head and tail kept."""
        if transcript.role(index) != "user":
            return False
        marker = transcript.marker(index)
        if marker is None:
            return True
        shortened = "removed_tokens" in marker or marker.get("offloaded") is True
        return marker.get("strategy") in (self.name, *_CUT_MARKERS) and shortened

    def _fit_words(self, transcript: Transcript, users: list[int], room: int) -> _Words:
        """The user's earlier messages within `room` tokens: the largest cut middle-out, then whole ones set aside."""
        sizes = {index: transcript.tokens(index) for index in users}
        if sum(sizes.values()) <= room:
            return _Words({index: Kept(index) for index in users}, [], sum(sizes.values()))
        order = self._removal_order(users)
        aside = self._set_aside(transcript, sizes, order, room)
        words = _Words({index: Kept(index) for index in users if index not in aside})
        words.tokens = sum(sizes[index] for index in words.kept)
        # The largest first, each by what is still over, so that as many as can stay whole.
        for index in sorted(words.kept, key=lambda index: (-sizes[index], index)):
            if words.tokens <= room or sizes[index] <= self.min_user_message_tokens:
                break
            cut = self._cut(transcript, index, min(words.tokens - room, sizes[index] - self.min_user_message_tokens))
            if cut is not None:
                words.kept[index] = cut
                words.tokens -= sizes[index] - transcript.counter.message_tokens(cut.message)
        for index, stand_in in aside.items():
            if stand_in is not None:
                words.kept[index] = stand_in
                words.tokens += transcript.counter.message_tokens(stand_in.message)
        # A cut lands near its size, not on it, and a message without text cannot be cut: remove more if need be.
        for index in order:
            if words.tokens <= room:
                break
            entry = words.kept.pop(index, None)
            if entry is not None:
                words.tokens -= (
                    sizes[index] if isinstance(entry, Kept) else transcript.counter.message_tokens(entry.message)
                )
        words.removed = [index for index in users if index not in words.kept]
        return words

    def _set_aside(
        self, transcript: Transcript, sizes: Mapping[int, int], order: list[int], room: int
    ) -> dict[int, Created | None]:
        """The messages that must go, in `order`, even if the rest are cut to `min_user_message_tokens`.

        Each is offloaded behind a reference (its stand-in) where a store is given, else removed (None).
        """
        floor = self.min_user_message_tokens
        floored = sum(min(size, floor) for size in sizes.values())
        aside: dict[int, Created | None] = {}
        for index in order:
            if floored <= room:
                break
            stand_in = self._offloaded(transcript, index)
            floored -= min(sizes[index], floor) - (
                transcript.counter.message_tokens(stand_in.message) if stand_in else 0
            )
            aside[index] = stand_in
        # A message set aside early in the order may have freed too little to matter: one set aside later made the
        # room, so each comes back, the last first, where it still fits.
        for index in reversed(list(aside)[:-1]):
            stand_in = aside[index]
            back = min(sizes[index], floor) - (transcript.counter.message_tokens(stand_in.message) if stand_in else 0)
            if floored + back <= room:
                floored += back
                del aside[index]
        return aside

    def _offloaded(self, transcript: Transcript, index: int) -> Created | None:
        """The stand-in of the user message at `index` offloaded to the store, or None (no store, or it cannot be)."""
        if self._offload is None or transcript.meta[index].get(OFFLOADED_META_KEY):
            return None
        offloaded = self._offload.offload(transcript, index)
        if offloaded is None:
            return None
        stand_in = created(
            {**transcript.messages[index], "content": offloaded.pointer},
            self.name,
            replacing=index,
            base_meta={**transcript.meta[index], OFFLOADED_META_KEY: list(offloaded.references)},
            offloaded=True,
            original_tokens=transcript.tokens(index),
        )
        return stand_in if transcript.counter.message_tokens(stand_in.message) < transcript.tokens(index) else None

    def _cut(self, transcript: Transcript, index: int, excess: int) -> Created | None:
        return cut_middle_out(transcript, index, excess, strategy=self.name, min_keep_tokens=0, notice=DEFAULT_NOTICE)

    def _removal_order(self, users: list[int]) -> list[int]:
        """The user's earlier messages in the order they are removed: the middle ones oldest first, the ends last."""
        opening = users[: self.opening_user_messages]
        rest = users[len(opening) :]
        split = max(len(rest) - self.latest_user_messages, 0)
        return [*rest[:split], *rest[split:], *reversed(opening)]


def _by_turn(units: list[Group], users: list[int]) -> list[Group]:
    """`units` (whole Agent steps and single messages, in order) joined into one per turn: those no user message parts.

    Dropping a turn's assistant and tool messages together keeps what survives of a turn whole, and lands a compaction
    as far under the target as the sliding window's turns do, so the next one comes no sooner.
    """
    turns: list[Group] = []
    starts = iter(users)
    boundary = next(starts, None)
    for unit in units:
        crossed = False
        while boundary is not None and boundary < unit[0]:
            crossed = True
            boundary = next(starts, None)
        if turns and not crossed:
            turns[-1] = [*turns[-1], *unit]
        else:
            turns.append(list(unit))
    return turns


def _count(marker: Mapping[str, Any], key: str) -> int:
    value = marker.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _source_position(entry: Entry) -> int:
    return entry.index if isinstance(entry, Kept) else (entry.replaces if entry.replaces is not None else -1)
