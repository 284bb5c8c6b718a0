"""Landmarks and units of removal in a conversation, with Haystack's semantics.

- The *leading instructions*: the system and developer messages a conversation opens with.
- The *current task*: anchored by the latest real user message (one compaction did not create).
- *Historical turns*: each real user message before the current task, with everything up to the next one.
- *Agent steps*: an assistant message with all the tool results that immediately follow it (parallel calls
  included), so a tool call is never separated from its results; an assistant message marked `CONTINUES_STEP`
  (the rest of the same model response) joins the step before it.

Turns and steps are the units compactors remove: kept or dropped whole, which is what keeps every tool result with
its call and every call with all its results.
"""

from __future__ import annotations

from proxy.engine.messages import CONTINUES_STEP, INSTRUCTION_ROLES, TOOL_RESULT_ROLES
from proxy.engine.transcript import Transcript

Group = list[int]
"""Indices of messages that are kept or removed together, oldest first."""


def leading_instructions_end(transcript: Transcript) -> int:
    """The end of the leading system/developer block (exclusive); compaction-created messages end it."""
    for index in range(len(transcript)):
        if transcript.role(index) not in INSTRUCTION_ROLES or transcript.marker(index) is not None:
            return index
    return len(transcript)


def latest_user_index(transcript: Transcript) -> int | None:
    """The index of the latest user message compaction did not create, or None when there is none."""
    for index in reversed(range(len(transcript))):
        if transcript.role(index) == "user" and transcript.marker(index) is None:
            return index
    return None


def last_assistant_index(transcript: Transcript) -> int:
    """The index of the last assistant message, or -1."""
    for index in reversed(range(len(transcript))):
        if transcript.role(index) == "assistant":
            return index
    return -1


def agent_step_groups(transcript: Transcript, start: int, end: int | None = None) -> list[Group]:
    """Agent steps from `start`: each assistant message with the tool results immediately following it."""
    stop = len(transcript) if end is None else end
    groups: list[Group] = []
    index = start
    while index < stop:
        if transcript.role(index) != "assistant":
            index += 1
            continue
        step_end = index + 1
        while step_end < stop and transcript.role(step_end) in TOOL_RESULT_ROLES:
            step_end += 1
        continues = transcript.messages[index].get(CONTINUES_STEP) is True
        if continues and groups and groups[-1][-1] == index - 1:
            groups[-1].extend(range(index, step_end))
        else:
            groups.append(list(range(index, step_end)))
        index = step_end
    return groups


def current_step_groups(transcript: Transcript, instructions_end: int, task_index: int | None) -> list[Group]:
    """The current task's Agent steps: from after the task's user message, or after the instructions if none."""
    start = task_index + 1 if task_index is not None else instructions_end
    return agent_step_groups(transcript, start)


def historical_turn_groups(transcript: Transcript, instructions_end: int, task_index: int | None) -> list[Group]:
    """Complete turns before the current task: each real user message and all that follows up to the next one."""
    history_end = task_index if task_index is not None else instructions_end
    starts = [
        index
        for index in range(instructions_end, history_end)
        if transcript.role(index) == "user" and transcript.marker(index) is None
    ]
    ends = [*starts[1:], history_end]
    return [list(range(start, end)) for start, end in zip(starts, ends, strict=False)]


def flatten(groups: list[Group]) -> list[int]:
    """The indices of all groups, in order."""
    return [index for group in groups for index in group]
