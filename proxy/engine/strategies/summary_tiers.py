"""Summary tiers: a conversation compacted before keeps its compacted head, so the provider's cache still serves it.

A provider's prompt cache serves the longest prefix a prompt shares with one it saw before. The first compaction
rewrites the conversation from the leading block on: [instructions][summary 1][recent messages]. Compacting it
again the same way would rewrite it from the leading block on once more, and everything after the instructions
would be billed uncached. Instead, a conversation that holds a summary keeps its *head* byte for byte: the
instructions and every message through its newest summary, and as many of the messages after that as fit in
`head_share` of the target. Only the fewest oldest messages after the head are summarized, so the newest fill the
rest of the target as they are (the latest user message and the newest Agent steps always among them):

    [instructions][summary 1][kept as forwarded ...][summary 2][latest user message][newest steps]

The next compaction then keeps that through summary 2, and so on: the tiers are appended, never rewritten, and a
compaction's uncached cost is the new summary and the messages after it instead of everything after the
instructions. When the head through the newest summary no longer fits in `head_share` of the target, the tiers are
merged the ordinary way (the caller's spans): one deliberate prefix break, after which the head starts again.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from proxy.engine.grouping import agent_step_groups, latest_user_index
from proxy.engine.transcript import Transcript


def tiered_span(
    transcript: Transcript,
    summaries: Sequence[int],
    target_tokens: int,
    *,
    head_share: float,
    min_keep_steps: int,
    summary_tokens: int,
) -> list[int] | None:
    """The messages after the conversation's compacted head to summarize, or None when the tiers must be merged.

    :param summaries: The indices of the summaries the conversation holds (after its leading block), oldest first;
        none means it was never summarized, and there is no head to keep.
    :param head_share: The share of `target_tokens` the kept head may take (0 keeps none: always merge).
    :param min_keep_steps: The newest Agent steps of the current task that stay as they are.
    :param summary_tokens: The expected size of the new summary: the head leaves room for it and the tail.
    :returns: The indices to summarize, oldest first: the fewest oldest messages after the head (whole Agent steps
        and turns, never the latest user message) whose summary brings the conversation to the target, so what is
        left of the target holds the newest messages as they are. None when there is no summary, when the head
        through the newest one exceeds its share, or when nothing lies between the head and the tail.
    """
    if not summaries or head_share <= 0:
        return None
    head_min = summaries[-1] + 1
    task = latest_user_index(transcript)
    steps = agent_step_groups(transcript, max(head_min, -1 if task is None else task + 1))
    kept_steps = steps[-min_keep_steps:] if min_keep_steps else []
    tail_start = kept_steps[0][0] if kept_steps else len(transcript)
    kept = transcript.tokens_of(range(tail_start, len(transcript)))
    if task is not None and head_min <= task < tail_start:
        kept += transcript.tokens(task)
    limit = min(head_share * target_tokens, target_tokens - summary_tokens - kept)
    if tail_start <= head_min or transcript.prefix_tokens(head_min) > limit:
        return None
    boundaries = [head_min, *_boundaries(transcript, head_min, tail_start), tail_start]
    head_end = max(end for end in boundaries[:-1] if transcript.prefix_tokens(end) <= limit)
    units = [
        [index for index in range(start, stop) if index != task]
        for start, stop in itertools.pairwise(boundaries[boundaries.index(head_end) :])
    ]
    return _fewest_oldest([unit for unit in units if unit], transcript, target_tokens - summary_tokens) or None


def _fewest_oldest(units: list[list[int]], transcript: Transcript, budget: int) -> list[int]:
    """The fewest oldest units whose removal brings the transcript to `budget` (all of them if none do)."""
    total = transcript.total()
    selected: list[int] = []
    for unit in units:
        if total <= budget:
            break
        selected.extend(unit)
        total -= transcript.tokens_of(unit)
    return selected


def _boundaries(transcript: Transcript, start: int, stop: int) -> list[int]:
    """Where the head may end after `start` and before `stop`, in order: before a message no tool call depends on.

    The start of every Agent step and every other message that is not part of one (a user message), so the head
    never separates a tool call from its results.
    """
    inside = {index for group in agent_step_groups(transcript, start, stop) for index in group[1:]}
    return [index for index in range(start + 1, stop) if index not in inside]
