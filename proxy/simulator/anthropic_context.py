"""The Messages API's server-side context management, as the fake Anthropic upstream performs it.

As Anthropic documents it ("Context editing" and "Compaction",
https://platform.claude.com/docs/en/build-with-claude/context-editing and .../compaction, and the `anthropic` SDK's
beta types, read 2026-12-05). Deliberately independent of `proxy.formats.anthropic` and of the engine, so a bug in the
proxy's estimate cannot hide in the fake. `context_management: {"edits": [...]}` is applied, in order, to what the
thinking checks left, before the prompt is counted, and the usage reports what was processed:

- `clear_tool_uses_20250919` (beta `context-management-2025-06-27`): once the prompt is over `trigger` (`input_tokens`,
  100,000 by default, or more `tool_uses` than its value), the results of every `tool_use` but the latest `keep` (3 by
  default) and those of `exclude_tools` are replaced by `PLACEHOLDER`, oldest first, and with `clear_tool_inputs`
  (true, or a list of tool names) the calls' inputs are emptied too; "Context will only be modified if at least this
  many tokens can be removed" (`clear_at_least`).
- `clear_thinking_20251015` (same beta): the thinking blocks of all but the latest `keep` assistant turns
  (`{"type": "thinking_turns", "value"}`, 1 by default; `"all"` or `{"type": "all"}` keeps every one) are removed;
  it "requires `thinking` to be enabled or adaptive".
- `compact_20260112` (beta `compact-2026-01-12`): every block before the last `compaction` block the client sends back
  is dropped ("The API automatically drops all message blocks prior to the compaction block"). Past `trigger` (150,000
  input tokens by default, at least 50,000) the API summarizes: the reply opens with a `compaction` block
  (`{"type": "compaction", "content": summary}`) and continues from it, or stops there (`stop_reason: "compaction"`)
  with `pause_after_compaction`. `usage.iterations` lists a `compaction` iteration (the whole prompt read, the summary
  written) and a `message` one; the top-level usage counts the `message` iterations only.

The response carries `context_management: {"applied_edits": [...]}`: per clearing edit that cleared anything, its
`type`, `cleared_input_tokens` and `cleared_tool_uses` (or `cleared_thinking_turns`). A malformed edit is refused
with the API's 400 body; the texts of those errors are the fake's own, in the API's `field: problem` style, except
the thinking one, which is the API's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from proxy.simulator.anthropic_rules import AnthropicError, blocks_of

EDITING_BETA: Final = "context-management-2025-06-27"
COMPACTION_BETA: Final = "compact-2026-01-12"
CLEAR_TOOL_USES: Final = "clear_tool_uses_20250919"
CLEAR_THINKING: Final = "clear_thinking_20251015"
COMPACT: Final = "compact_20260112"
BETAS: Final = {CLEAR_TOOL_USES: EDITING_BETA, CLEAR_THINKING: EDITING_BETA, COMPACT: COMPACTION_BETA}
PLACEHOLDER: Final = "[Tool result cleared]"
"""What a cleared result holds (the API's text is not documented)."""
MIN_COMPACT_TRIGGER: Final = 50_000

Count = Callable[[Sequence[Mapping[str, Any]]], int]
"""The prompt's tokens with these messages (tools and system included)."""


@dataclass
class Managed:
    """What the edits left and did.

    :param messages: What the model reads.
    :param applied: The `applied_edits` entries.
    :param compact: The compaction edit that triggered, or None.
    """

    messages: list[dict[str, Any]]
    applied: list[dict[str, Any]] = field(default_factory=list)
    compact: Mapping[str, Any] | None = None


def check_edits(body: Mapping[str, Any], headers: Mapping[str, str]) -> list[Mapping[str, Any]]:
    """The request's edits, refused with the API's 400 when malformed or without their beta header."""
    management = body.get("context_management")
    if management is None:
        return []
    edits = management.get("edits") if isinstance(management, Mapping) else None
    if not isinstance(edits, list):
        raise AnthropicError("context_management.edits: Input should be a valid list")
    betas = {name.strip() for name in headers.get("anthropic-beta", "").split(",")}
    for position, edit in enumerate(edits):
        where = f"context_management.edits.{position}"
        kind = edit.get("type") if isinstance(edit, Mapping) else None
        if kind not in BETAS:
            raise AnthropicError(
                f"{where}.type: Input tag {kind!r} found using 'type' does not match any of the "
                f"expected tags: {', '.join(repr(name) for name in BETAS)}"
            )
        if BETAS[kind] not in betas:
            raise AnthropicError(f"{where}: This strategy requires the `anthropic-beta: {BETAS[kind]}` header.")
        _check_edit(body, edit, where)
    return edits


def _check_edit(body: Mapping[str, Any], edit: Mapping[str, Any], where: str) -> None:
    kind = edit["type"]
    if kind == CLEAR_TOOL_USES:
        _amount(edit.get("trigger"), ("input_tokens", "tool_uses"), f"{where}.trigger")
        _amount(edit.get("keep"), ("tool_uses",), f"{where}.keep")
        _amount(edit.get("clear_at_least"), ("input_tokens",), f"{where}.clear_at_least")
        _names(edit.get("exclude_tools"), f"{where}.exclude_tools")
        if not isinstance(edit.get("clear_tool_inputs"), bool):
            _names(edit.get("clear_tool_inputs"), f"{where}.clear_tool_inputs")
    elif kind == CLEAR_THINKING:
        thinking = body.get("thinking")
        if not isinstance(thinking, Mapping) or thinking.get("type") not in ("enabled", "adaptive"):
            raise AnthropicError("`clear_thinking_20251015` strategy requires `thinking` to be enabled or adaptive")
        keep = edit.get("keep")
        if keep != "all" and not (isinstance(keep, Mapping) and keep.get("type") == "all"):
            _amount(keep, ("thinking_turns",), f"{where}.keep")
    else:
        trigger = _amount(edit.get("trigger"), ("input_tokens",), f"{where}.trigger")
        if trigger is not None and trigger < MIN_COMPACT_TRIGGER:
            raise AnthropicError(
                f"{where}.trigger.value: Input should be greater than or equal to {MIN_COMPACT_TRIGGER}"
            )
        if not isinstance(edit.get("pause_after_compaction", False), bool):
            raise AnthropicError(f"{where}.pause_after_compaction: Input should be a valid boolean")


def _amount(value: Any, kinds: tuple[str, ...], where: str) -> int | None:
    """A `{"type", "value"}` object's value (None when absent), refused when malformed."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or value.get("type") not in kinds:
        raise AnthropicError(f"{where}.type: Input should be {' or '.join(repr(kind) for kind in kinds)}")
    amount = value.get("value")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount < 0:
        raise AnthropicError(f"{where}.value: Input should be a valid integer greater than or equal to 0")
    return amount


def _names(value: Any, where: str) -> None:
    if value is not None and (not isinstance(value, list) or not all(isinstance(name, str) for name in value)):
        raise AnthropicError(f"{where}: Input should be a valid list of strings")


def manage(messages: list[dict[str, Any]], edits: Sequence[Mapping[str, Any]], count: Count) -> Managed:
    """Apply `edits` to `messages` (see the module docstring): what the model reads, and what was done."""
    managed = Managed(_from_last_compaction(messages))
    for edit in edits:
        if edit["type"] == CLEAR_TOOL_USES:
            _clear_tool_uses(managed, edit, count)
        elif edit["type"] == CLEAR_THINKING:
            _clear_thinking(managed, edit, count)
        elif count(managed.messages) > _value(edit.get("trigger"), 150_000):
            managed.compact = edit
    return managed


def _value(amount: Any, default: int) -> int:
    return int(amount["value"]) if isinstance(amount, Mapping) else default


def _from_last_compaction(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages from the last `compaction` block on (the blocks before it in its message dropped too)."""
    for position in reversed(range(len(messages))):
        blocks = blocks_of(messages[position])
        marks = [index for index, block in enumerate(blocks) if _kind(block) == "compaction"]
        if marks:
            return [{**messages[position], "content": blocks[marks[-1] :]}, *messages[position + 1 :]]
    return messages


def _kind(block: Any) -> str:
    return str(block.get("type")) if isinstance(block, Mapping) else ""


def _clear_tool_uses(managed: Managed, edit: Mapping[str, Any], count: Count) -> None:
    messages = managed.messages
    uses = [
        (position, block)
        for position, message in enumerate(messages)
        for block in blocks_of(message)
        if _kind(block) == "tool_use"
    ]
    trigger = edit.get("trigger")
    before = count(messages)
    if isinstance(trigger, Mapping) and trigger.get("type") == "tool_uses":
        triggered = len(uses) > int(trigger["value"])
    else:
        triggered = before > _value(trigger, 100_000)
    if not triggered:
        return
    excluded = set(edit.get("exclude_tools") or ())
    inputs = edit.get("clear_tool_inputs") or False
    candidates = uses[: max(len(uses) - _value(edit.get("keep"), 3), 0)]
    cleared = {block.get("id"): block.get("name") for _, block in candidates if block.get("name") not in excluded}
    if not cleared:
        return
    edited = [_cleared_message(message, cleared, inputs) for message in messages]
    removed = before - count(edited)
    if removed <= 0 or removed < _value(edit.get("clear_at_least"), 0):
        return
    managed.messages = edited
    entry = {"type": CLEAR_TOOL_USES, "cleared_input_tokens": removed, "cleared_tool_uses": len(cleared)}
    managed.applied.append(entry)


def _cleared_message(message: dict[str, Any], cleared: Mapping[Any, Any], inputs: Any) -> dict[str, Any]:
    blocks = blocks_of(message)
    if not any(_kind(block) in ("tool_use", "tool_result") for block in blocks):
        return message
    edited: list[Any] = []
    for block in blocks:
        kind = _kind(block)
        if kind == "tool_result" and block.get("tool_use_id") in cleared:
            block = {**block, "content": PLACEHOLDER}  # noqa: PLW2901 - the block as the model reads it
        elif kind == "tool_use" and block.get("id") in cleared:
            name = cleared[block.get("id")]
            if inputs is True or (isinstance(inputs, list) and name in inputs):
                block = {**block, "input": {}}  # noqa: PLW2901
        edited.append(block)
    return {**message, "content": edited}


def _clear_thinking(managed: Managed, edit: Mapping[str, Any], count: Count) -> None:
    keep = edit.get("keep")
    if keep == "all" or (isinstance(keep, Mapping) and keep.get("type") == "all"):
        return
    messages = managed.messages
    turns = [
        position
        for position, message in enumerate(messages)
        if message.get("role") == "assistant"
        and any(_kind(b) in ("thinking", "redacted_thinking") for b in blocks_of(message))
    ]
    cleared = set(turns[: max(len(turns) - _value(keep, 1), 0)])
    if not cleared:
        return
    before = count(messages)
    managed.messages = [
        {**message, "content": [b for b in blocks_of(message) if _kind(b) not in ("thinking", "redacted_thinking")]}
        if position in cleared
        else message
        for position, message in enumerate(messages)
    ]
    entry = {"type": CLEAR_THINKING, "cleared_input_tokens": before - count(managed.messages)}
    managed.applied.append({**entry, "cleared_thinking_turns": len(cleared)})
