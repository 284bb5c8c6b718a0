"""Landmarks and units of removal in a conversation, with Haystack's semantics.

- The *leading block*: what a conversation opens with and every strategy leaves byte for byte, never cut, dropped
  or summarized (`leading_instructions_end`). It is the system and developer messages a conversation opens with,
  and, among them, the context a client states up front in user messages of its own making, as far as it can be
  recognized: a user message whose text begins (after whitespace) with `<environment_context>`,
  `<user_instructions>` or `# AGENTS.md instructions` (what Codex CLI sends before the first real prompt). The block
  ends at the first other message, or at the first message compaction created.
- The *current task*: anchored by the latest real user message after the leading block (one compaction did not
  create), which every strategy leaves byte for byte too.
- *Historical turns*: each real user message before the current task, with everything up to the next one.
- *Agent steps*: an assistant message with all the tool results that immediately follow it (parallel calls
  included), so a tool call is never separated from its results; an assistant message marked `CONTINUES_STEP`
  (the rest of the same model response) joins the step before it.

Turns and steps are the units compactors remove: kept or dropped whole, which is what keeps every tool result with
its call and every call with all its results.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.engine.messages import CONTINUES_STEP, INSTRUCTION_ROLES, TOOL_RESULT_ROLES, Message, content_texts, role_of
from proxy.engine.plan import COMPACTION_META_KEY, Created, EditPlan, Kept
from proxy.engine.transcript import Transcript

Group = list[int]
"""Indices of messages that are kept or removed together, oldest first."""

CLIENT_CONTEXT_OPENINGS = ("<environment_context>", "<user_instructions>", "# AGENTS.md instructions")
"""How a user message a client states its context in begins: such a message, among the leading instructions, belongs
to them (Codex CLI's environment and its AGENTS.md / user instructions)."""

_CLIENT_CONTEXT = re.compile(r"\s*(?:" + "|".join(map(re.escape, CLIENT_CONTEXT_OPENINGS)) + ")")
"""Matched at a text's start, whitespace first, without copying the text (a first prompt can be megabytes)."""


def is_client_context(message: Message) -> bool:
    """Whether `message` is a user message stating the client's context (see `CLIENT_CONTEXT_OPENINGS`)."""
    if role_of(message) != "user":
        return False
    return _CLIENT_CONTEXT.match(next(content_texts(message), "")) is not None


def leading_block_end(messages: Sequence[Message], meta: Sequence[Mapping[str, Any]] | None = None) -> int:
    """The end (exclusive) of the leading block of `messages` (see the module docstring).

    :param meta: Per-message metadata; a message whose metadata holds a compaction marker ends the block.
    """
    for index, message in enumerate(messages):
        marked = meta is not None and isinstance(meta[index].get(COMPACTION_META_KEY), Mapping)
        if marked or not (role_of(message) in INSTRUCTION_ROLES or is_client_context(message)):
            return index
    return len(messages)


def leading_instructions_end(transcript: Transcript) -> int:
    """The end of the transcript's leading block (exclusive): the messages every strategy keeps byte for byte."""
    return leading_block_end(transcript.messages, transcript.meta)


def latest_user_index(transcript: Transcript) -> int | None:
    """The index of the latest user message after the leading block compaction did not create, or None."""
    start = leading_instructions_end(transcript)
    for index in reversed(range(start, len(transcript))):
        if transcript.role(index) == "user" and transcript.marker(index) is None:
            return index
    return None


def protected_indices(transcript: Transcript) -> set[int]:
    """The messages no strategy may change or remove: the leading block and the latest real user message."""
    task = latest_user_index(transcript)
    return {*range(leading_instructions_end(transcript)), *(() if task is None else (task,))}


def keeps_protected(transcript: Transcript, plan: EditPlan) -> bool:
    """Whether `plan` (over `transcript`) opens with the leading block as it is and keeps the latest user message."""
    end = leading_instructions_end(transcript)
    if len(plan.entries) < end or any(plan.entries[index] != Kept(index) for index in range(end)):
        return False
    task = latest_user_index(transcript)
    return task is None or _keeps(plan, task)


def _keeps(plan: EditPlan, index: int) -> bool:
    """Whether `plan` keeps source message `index` as it is.

    Plans keep their source's order, so the search runs back from the end and stops at the first original before
    `index`: the latest user message is near the end, and a plan over a long conversation is not walked whole.
    """
    for entry in reversed(plan.entries):
        position = entry.index if isinstance(entry, Kept) else entry.replaces
        if position is not None and position <= index:
            return position == index and isinstance(entry, Kept)
    return False


def with_leading_block(plan: EditPlan, messages: Sequence[Message]) -> EditPlan:
    """`plan` (over `messages`, as the client sent them) with the leading block restored as it was sent.

    A plan remembered from before the block was protected may have cut or dropped some of it; replaying that plan
    would keep the loss going turn after turn. The block's messages go back first, as sent, and whatever stood in for
    them goes; everything else stays as the plan has it.
    """
    end = leading_block_end(messages)
    if len(plan.entries) >= end and all(plan.entries[index] == Kept(index) for index in range(end)):
        return plan
    rest = tuple(
        entry
        for entry in plan.entries
        if not (entry.index < end if isinstance(entry, Kept) else _replaces_below(entry, end))
    )
    return EditPlan(plan.source_length, (*(Kept(index) for index in range(end)), *rest), plan.read_tool)


def _replaces_below(entry: Created, end: int) -> bool:
    return entry.replaces is not None and entry.replaces < end


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


def newest_that_fit(transcript: Transcript, groups: list[Group], budget: int) -> int:
    """The position from which the newest groups fit in `budget`, adding newest first and stopping at the first miss."""
    first = len(groups)
    while first > 0:
        tokens = transcript.tokens_of(groups[first - 1])
        if tokens > budget:
            break
        budget -= tokens
        first -= 1
    return first
