"""A Messages request's `context_management` as the engine's neutral description of the provider's edits.

The formats, as Anthropic documents them ("Context editing" and "Compaction",
https://platform.claude.com/docs/en/build-with-claude/context-editing and .../compaction, and the `anthropic` SDK's
`BetaContextManagementConfigParam`, read 2026-12-05): `context_management: {"edits": [...]}`, each edit one of

- `{"type": "clear_tool_uses_20250919", "trigger", "keep", "clear_at_least", "exclude_tools", "clear_tool_inputs"}`
  (beta `context-management-2025-06-27`): `trigger` is `{"type": "input_tokens" | "tool_uses", "value"}` (100,000
  input tokens by default), `keep` `{"type": "tool_uses", "value"}` (3 by default), `clear_at_least`
  `{"type": "input_tokens", "value"}` ("Context will only be modified if at least this many tokens can be removed"),
  `exclude_tools` a list of tool names, `clear_tool_inputs` a bool or a list of tool names. The oldest tool results
  are cleared first, "replacing them with placeholder text"; the text is not documented (`PLACEHOLDER` stands in).
- `{"type": "clear_thinking_20251015", "keep"}`: older turns' thinking blocks go. The proxy does not estimate it
  (thinking is opaque to the engine, and counting more than the provider processes is the safe side).
- `{"type": "compact_20260112", "trigger", "pause_after_compaction", "instructions"}` (beta `compact-2026-01-12`):
  the provider summarizes past `trigger` (`{"type": "input_tokens", "value"}`, 150,000 by default), and on later
  requests "automatically drops all message blocks prior to the compaction block" (`reads_from_checkpoint`).

Anything else (an unknown edit type, a field of the wrong kind) is not understood: `provider_edits` gives None and
the request is treated as today, as a client that manages its own context.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from proxy.engine.provider_edits import ProviderEdits, ToolResultClearing

CLEAR_TOOL_USES: Final = "clear_tool_uses_20250919"
CLEAR_THINKING: Final = "clear_thinking_20251015"
COMPACT: Final = "compact_20260112"

DEFAULT_CLEAR_TRIGGER: Final = 100_000
DEFAULT_KEEP: Final = 3
DEFAULT_COMPACT_TRIGGER: Final = 150_000

PLACEHOLDER: Final = "[Tool result cleared]"
"""What a cleared result is estimated to leave: the provider's text is undocumented, and a few tokens either way are
within the tokenizer slack of every estimate."""


class NotUnderstood(ValueError):
    """An edit the proxy does not read: the request is treated as managing its own context."""


def provider_edits(body: Mapping[str, Any]) -> ProviderEdits | None:
    """The request's edits, or None when it asks for none or for any the proxy does not understand."""
    management = body.get("context_management")
    if not isinstance(management, Mapping) or not isinstance(edits := management.get("edits"), list):
        return None
    clearings: list[ToolResultClearing] = []
    compaction: int | None = None
    try:
        for edit in edits:
            kind = edit.get("type") if isinstance(edit, Mapping) else None
            if kind == CLEAR_TOOL_USES:
                clearings.append(_clearing(edit))
            elif kind == COMPACT:
                compaction = _amount(edit.get("trigger"), ("input_tokens",), DEFAULT_COMPACT_TRIGGER)[1]
            elif kind != CLEAR_THINKING:
                raise NotUnderstood(kind)
    except NotUnderstood:
        return None
    return ProviderEdits(tuple(clearings), compaction, reads_from_checkpoint=compaction is not None)


def _clearing(edit: Mapping[str, Any]) -> ToolResultClearing:
    trigger_kind, trigger = _amount(edit.get("trigger"), ("input_tokens", "tool_uses"), DEFAULT_CLEAR_TRIGGER)
    keep = _amount(edit.get("keep"), ("tool_uses",), DEFAULT_KEEP)[1]
    at_least = _amount(edit.get("clear_at_least"), ("input_tokens",), 0)[1]
    return ToolResultClearing(
        trigger_tokens=trigger if trigger_kind == "input_tokens" else None,
        trigger_tool_uses=trigger if trigger_kind == "tool_uses" else 0,
        keep=keep,
        clear_at_least=at_least,
        exclude_tools=_names(edit.get("exclude_tools")),
        clear_inputs=_inputs(edit.get("clear_tool_inputs")),
        placeholder=PLACEHOLDER,
    )


def _amount(value: Any, kinds: tuple[str, ...], default: int) -> tuple[str, int]:
    """A `{"type", "value"}` object of one of `kinds`: its kind and value (`default` of the first kind when absent)."""
    if value is None:
        return kinds[0], default
    if not isinstance(value, Mapping) or value.get("type") not in kinds:
        raise NotUnderstood(value)
    amount = value.get("value")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount < 0:
        raise NotUnderstood(value)
    return str(value["type"]), amount


def _names(value: Any) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise NotUnderstood(value)
    return frozenset(value)


def _inputs(value: Any) -> bool | frozenset[str]:
    return value if isinstance(value, bool) else _names(value)
