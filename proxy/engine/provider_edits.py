"""What a provider removes from a request on its side before the model reads it, estimated on the engine's messages.

A provider may edit the prompt itself (Anthropic's context editing: the oldest tool results replaced by a placeholder
once the prompt passes a threshold). What it will clear is not what the proxy must remove: the proxy decides on what
the provider will actually process, and when it still has to compact, it spends its removal on what the provider keeps.

The front end translates its wire format's edits into this neutral description (`ProviderEdits`); `provider_view`
applies them to a transcript, in the provider's tokens, as the provider documents it:

- `ToolResultClearing`: once the prompt exceeds `trigger_tokens` (or holds more than `trigger_tool_uses` tool calls),
  every tool result but those of the latest `keep` calls (and of the `exclude_tools`) is replaced by `placeholder`,
  and with `clear_inputs` the call's arguments too; nothing is cleared unless that removes at least `clear_at_least`
  tokens. Rules apply in order, each on what the one before left.
- `compaction_trigger`: the provider summarizes the conversation itself past so many tokens. The proxy does not
  estimate that summary; it defers to it instead (`proxy.pipeline.client_compaction`).
- `reads_from_checkpoint`: the provider reads the conversation from its latest compaction item on (a checkpoint,
  `proxy.engine.messages.CHECKPOINT`), the leading instructions aside: what lies between counts nothing.

Counts are local (the transcript's counter) scaled by the calibration into the provider's tokens, so the estimate
after the edits never exceeds the estimate before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.engine.grouping import leading_instructions_end
from proxy.engine.messages import Message, is_checkpoint, is_tool_result, tool_calls_of, tool_name_of_call
from proxy.engine.transcript import Transcript


@dataclass(frozen=True)
class ToolResultClearing:
    """One tool-result clearing rule (see the module docstring).

    :param trigger_tokens: The prompt size past which it clears; None when a tool-call count triggers it instead.
    :param trigger_tool_uses: The number of tool calls past which it clears (used when `trigger_tokens` is None).
    :param keep: The latest tool calls whose results stay.
    :param clear_at_least: The least it clears when it clears at all, in the provider's tokens.
    :param exclude_tools: Tools whose results are never cleared.
    :param clear_inputs: Whether the cleared calls' arguments go too: True for every tool, or the tools named.
    :param placeholder: The text a cleared result is replaced with.
    """

    trigger_tokens: int | None
    trigger_tool_uses: int = 0
    keep: int = 0
    clear_at_least: int = 0
    exclude_tools: frozenset[str] = frozenset()
    clear_inputs: bool | frozenset[str] = False
    placeholder: str = ""

    def triggered(self, tokens: int, tool_uses: int) -> bool:
        """Whether a prompt of `tokens` holding `tool_uses` calls is past the trigger."""
        if self.trigger_tokens is not None:
            return tokens > self.trigger_tokens
        return tool_uses > self.trigger_tool_uses

    def clears_input(self, tool: str) -> bool:
        """Whether a cleared call of `tool` loses its arguments too."""
        return self.clear_inputs if isinstance(self.clear_inputs, bool) else tool in self.clear_inputs


@dataclass(frozen=True)
class ProviderEdits:
    """The edits a request asks its provider to make on its side.

    :param clearings: Tool-result clearing rules, in the order the provider applies them.
    :param compaction_trigger: The prompt size past which the provider compacts the conversation; None when not asked.
    :param reads_from_checkpoint: The provider drops what lies before the latest checkpoint.
    """

    clearings: tuple[ToolResultClearing, ...] = ()
    compaction_trigger: int | None = None
    reads_from_checkpoint: bool = False

    def compacts_before(self, trigger_tokens: float | None) -> bool:
        """Whether the provider's own compaction comes at or before `trigger_tokens` (None: any compaction does)."""
        if self.compaction_trigger is None:
            return False
        return trigger_tokens is None or self.compaction_trigger <= trigger_tokens


@dataclass(frozen=True)
class ProviderView:
    """A transcript as the provider will process it after its edits.

    :param transcript: The same messages, with the counts of what the provider clears set to what it leaves of them.
    :param estimated_tokens: The request's size after the edits, in the provider's tokens.
    :param cleared_tokens: What the edits remove, in the provider's tokens (0 when none applies).
    :param cleared: The positions of the messages the edits change.
    """

    transcript: Transcript
    estimated_tokens: int
    cleared_tokens: int = 0
    cleared: frozenset[int] = field(default_factory=frozenset)


def provider_view(transcript: Transcript, edits: ProviderEdits, estimated_tokens: int, scale: float) -> ProviderView:
    """The transcript and its size once the provider made `edits` (see the module docstring).

    :param estimated_tokens: The request's estimated size as sent, in the provider's tokens.
    :param scale: Provider tokens per local token.
    """
    counts = _dropped_before_checkpoint(transcript) if edits.reads_from_checkpoint else {}
    estimate = estimated_tokens - round(scale * sum(transcript.tokens(index) for index in counts))
    for rule in edits.clearings:
        after = _cleared_counts(transcript, rule, counts) if rule.triggered(estimate, _tool_uses(transcript)) else None
        local = sum(transcript.tokens(index) - tokens for index, tokens in after.items()) if after else 0
        removed = round(scale * local)
        if after is None or removed < max(rule.clear_at_least, 1):
            continue
        counts.update(after)
        estimate -= removed
    if not counts:
        return ProviderView(transcript, estimated_tokens)
    tokens = [counts.get(index, transcript.tokens(index)) for index in range(len(transcript))]
    viewed = Transcript(transcript.messages, transcript.counter, transcript.meta, tokens)
    return ProviderView(viewed, estimate, estimated_tokens - estimate, frozenset(counts))


def _dropped_before_checkpoint(transcript: Transcript) -> dict[int, int]:
    """Zero counts for what lies between the leading instructions and the latest checkpoint."""
    latest = next((i for i in reversed(range(len(transcript))) if is_checkpoint(transcript.messages[i])), None)
    if latest is None:
        return {}
    return dict.fromkeys(range(leading_instructions_end(transcript), latest), 0)


def _tool_uses(transcript: Transcript) -> int:
    return sum(len(tool_calls_of(message)) for message in transcript.messages)


def _cleared_counts(transcript: Transcript, rule: ToolResultClearing, done: Mapping[int, int]) -> dict[int, int] | None:
    """The counts of the messages `rule` would change, by position; None when it changes none.

    Messages an earlier rule changed already stay as that rule left them.
    """
    calls: list[tuple[int, str, str]] = []
    for index, message in enumerate(transcript.messages):
        calls.extend((index, str(call.get("id")), tool_name_of_call(call)) for call in tool_calls_of(message))
    candidates = calls[: max(len(calls) - rule.keep, 0)]
    cleared = {call_id: (index, name) for index, call_id, name in candidates if name not in rule.exclude_tools}
    if not cleared:
        return None
    after: dict[int, int] = {}
    stripped: dict[int, set[str]] = {}
    for index, message in enumerate(transcript.messages):
        call_id = str(message.get("tool_call_id"))
        if is_tool_result(message) and call_id in cleared and index not in done:
            after[index] = transcript.counter.message_tokens({**message, "content": rule.placeholder})
            caller, name = cleared[call_id]
            if rule.clears_input(name) and caller not in done:
                stripped.setdefault(caller, set()).add(call_id)
    for index, call_ids in stripped.items():
        after[index] = transcript.counter.message_tokens(_without_arguments(transcript.messages[index], call_ids))
    shrunk = {index: tokens for index, tokens in after.items() if tokens < transcript.tokens(index)}
    return shrunk or None


def _without_arguments(message: Message, call_ids: set[str]) -> Message:
    """`message` with the arguments of the calls `call_ids` emptied."""
    calls: list[Any] = []
    for call in tool_calls_of(message):
        function = call.get("function")
        if str(call.get("id")) in call_ids and isinstance(function, Mapping):
            calls.append({**call, "function": {**function, "arguments": "{}"}})
        else:
            calls.append(call)
    return {**message, "tool_calls": calls}
