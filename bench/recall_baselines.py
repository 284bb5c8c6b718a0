"""Simple compaction strategies the proxy's chains are measured against in `bench.recall`.

They are engine `Strategy` subclasses, so they keep the engine's invariants (the leading block and the latest user
message byte for byte, tool calls with their results), and run through the real proxy as a chain it is given in
place of the one its settings name; the product's registry does not know them. `BASELINES` makes each row's chain.

- **Drop-oldest truncation**: the oldest whole turns go, silently, until the rest fits just under the trigger (as an
  API's automatic truncation does: only what must go, so the next turns truncate again).
- **Sliding window**: the engine's `SlidingWindow` alone: the oldest whole turns go until the rest fits the target.
- **Keep the opening and the latest**: old tool results are cut to their head and tail; if that is not enough, whole
  turns go from the middle, oldest first, keeping the conversation's opening turns and its latest ones.
- **Clear old tool results**: every tool result but the newest few gives way to a placeholder (as Anthropic's
  `clear_tool_uses` context editing does), then the sliding window if that is not enough.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from proxy.engine import CompactionChain, SlidingWindow, Strategy, Transcript
from proxy.engine.grouping import historical_turn_groups, latest_user_index, leading_instructions_end
from proxy.engine.plan import Created, EditPlan, Kept
from proxy.engine.strategies.base import replace_until_target
from proxy.engine.tool_results import holds_result
from proxy.engine.transcript import created

CUT_NOTICE: Final = "\n[... the middle of this tool result was cut ...]\n"
CLEARED: Final = "[Old tool result cleared.]"


class DropOldest(SlidingWindow):
    """Drops the oldest whole turns, with no note, until the conversation fits just under the trigger.

    :param fill: The share of the target it aims at instead: the trigger over the target, a little under, so it
        removes only what must go now.
    """

    name = "drop_oldest"

    def __init__(self, fill: float) -> None:
        super().__init__(omission_note=None)
        self.fill = fill

    def plan(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        """The sliding window's plan toward `fill` times the target."""
        return super().plan(transcript, int(target_tokens * self.fill))


def _old_results(transcript: Transcript, keep: int) -> list[int]:
    """The tool results still holding their output, oldest first, but the newest `keep`."""
    results = [index for index in range(len(transcript)) if holds_result(transcript, index)]
    return results[: max(len(results) - keep, 0)]


def _with_text(transcript: Transcript, index: int, text: str, strategy: str) -> Created | None:
    """Tool result `index` with `text` for its content, or None when its content is not one text."""
    message = transcript.messages[index]
    if not isinstance(message.get("content"), str):
        return None
    return created({**message, "content": text}, strategy, replacing=index, base_meta=transcript.meta[index])


class KeepOpeningAndLatest(Strategy):
    """Cuts old tool results to head and tail, then drops middle turns, keeping the opening and the latest turns.

    :param opening_turns: The conversation's first turns (a user message and all that answers it), kept whole
        unless nothing else is left to drop.
    :param keep_results: The newest tool results never cut.
    :param head_tail_tokens: The tokens of a cut result's head and tail together.
    """

    name = "keep_opening_and_latest"

    def __init__(self, opening_turns: int = 2, keep_results: int = 3, head_tail_tokens: int = 200) -> None:
        self.opening_turns = opening_turns
        self.keep_results = keep_results
        self.head_tail_tokens = head_tail_tokens

    def _propose(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        candidates = _old_results(transcript, self.keep_results)
        cut = replace_until_target(transcript, target_tokens, candidates, lambda index, _: self._cut(transcript, index))
        current = transcript if cut is None else transcript.edited(cut)
        dropped = self._drop_middle(current, target_tokens)
        if cut is None or dropped is None:
            return cut or dropped
        return cut.then(dropped)

    def _cut(self, transcript: Transcript, index: int) -> Created | None:
        text = transcript.messages[index].get("content")
        if not isinstance(text, str):
            return None
        head, tail = transcript.counter.cut_middle(text, self.head_tail_tokens)
        return _with_text(transcript, index, head + CUT_NOTICE + tail, self.name)

    def _drop_middle(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        """Whole turns gone, those after the opening ones oldest first, then the opening ones, until it fits."""
        start = leading_instructions_end(transcript)
        turns = historical_turn_groups(transcript, start, latest_user_index(transcript))
        total, removed = transcript.total(), set[int]()
        for turn in turns[self.opening_turns :] + turns[: self.opening_turns]:
            if total <= target_tokens:
                break
            removed.update(turn)
            total -= transcript.tokens_of(turn)
        if not removed:
            return None
        entries = tuple(Kept(index) for index in range(len(transcript)) if index not in removed)
        return EditPlan(len(transcript), entries)


class ClearOldToolResults(Strategy):
    """Replaces every tool result but the newest `keep` with a short placeholder, all at once.

    :param keep: The newest tool results left as they are.
    """

    name = "clear_old_tool_results"

    def __init__(self, keep: int = 3) -> None:
        self.keep = keep

    def _propose(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        return replace_until_target(
            transcript,
            0,  # clears all of them, not only until the target
            _old_results(transcript, self.keep),
            lambda index, _: _with_text(transcript, index, CLEARED, self.name),
        )


BASELINES: Final[dict[str, Callable[[float], CompactionChain]]] = {
    "drop-oldest truncation": lambda fill: CompactionChain([DropOldest(fill)]),
    "sliding window": lambda _fill: CompactionChain([SlidingWindow()]),
    "keep opening and latest, old tool results cut to head and tail": lambda _fill: CompactionChain(
        [KeepOpeningAndLatest()]
    ),
    "clear old tool results, then sliding window": lambda _fill: CompactionChain(
        [ClearOldToolResults(), SlidingWindow()]
    ),
}
"""Each baseline's chain, given the trigger over the target (what `DropOldest` fills to)."""
