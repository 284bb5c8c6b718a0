"""The shape and pairing rules the fake OpenAI upstream enforces on a Responses API request's `input` items.

What is checked, each with the error body OpenAI answers (status 400, `type: "invalid_request_error"`):

- **Shape**, worded as OpenAI's live API answers. Each item is an object ("Invalid type for 'input[i]': expected an
  input item, but got ... instead.") with a known `type` (a message may leave it out and give only `role`); else
  "Invalid value: 'x'. Supported values are: ..." (param `input[i]`, code `invalid_value`; an item with neither is
  refused for its role, ''). Messages need a valid `role` (same param) and a `content` string or array of parts of a
  known type (param `input[i].content[k].type`) that fits the role: input parts for user, system and developer
  messages, output text and refusals for assistant ones (param `input[i].content[k]`). Function and custom tool
  calls need `call_id`, `name` and `arguments`/`input`; their outputs need `call_id` and `output`; reasoning items
  need `summary`; compaction items need `encrypted_content`. These items take only the members OpenAI documents for
  them: "Unknown parameter: 'input[i].x'." (code `unknown_parameter`). Other built-in tool items (`web_search_call`,
  `computer_call`, `mcp_call`, ...) are accepted as they are. An item `id` must begin with its
  type's prefix (`fc` for function calls, `rs` reasoning, `msg` messages, `cmp` compaction): "Invalid
  'input[i].id': '{id}'. Expected an ID that begins with 'fc'." (code `invalid_value`).
- **Unique ids** (param `input`, code null): "Duplicate item found with id {id}. Remove duplicate items from your
  input and try again.", also when an item repeats one of the stored response that `previous_response_id` names.
- **Pairing** (param `input`, code null), as OpenAI words it:
  "No tool call found for function call output with call_id {call_id}." for an output before (or without) its call,
  "No tool output found for function call {call_id}." for a call with no output after it. Custom tool calls get
  the same rules and wording with "custom tool call" (the fake's guess at OpenAI's wording for them).
- **Reasoning** (param `input`, code null), only for items whose `id` this fake issued (see `ItemOrigin`):
  "Item '{id}' of type '{type}' was provided without its required 'reasoning' item: '{rs_id}'." when an item that
  followed a reasoning item in its response comes without that reasoning item earlier in the input, and
  "Item '{rs_id}' of type 'reasoning' was provided without its required following item." when the item right after
  a reasoning item is not the one that followed it in its response (by `id`; an item without `id` of the same type,
  and role for a message, also counts, as a client that strips ids sends it).

The module never mutates what it is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.simulator.openai_common import OpenAIError, invalid_type, invalid_value, missing_parameter

__all__ = [
    "CALL_OUTPUT_TYPES",
    "ITEM_TYPES",
    "ItemOrigin",
    "check_pairing",
    "check_reasoning",
    "check_unique_ids",
    "item_shape",
    "item_type",
    "normalize_input",
    "validate_items",
]

MESSAGE_ROLES = ("assistant", "system", "developer", "user")
CONTENT_PART_TYPES = (
    "input_text",
    "input_image",
    "input_audio",
    "output_text",
    "refusal",
    "input_file",
    "computer_screenshot",
    "summary_text",
    "encrypted_content",
)
_INPUT_PART_TYPES = ("input_text", "input_image", "input_file", "scoped_content", "input_audio")
_OUTPUT_PART_TYPES = ("output_text", "refusal")

_CALL_MEMBERS = frozenset({"type", "id", "call_id", "caller", "namespace"})
_MEMBERS: dict[str, frozenset[str]] = {
    "message": frozenset({"type", "role", "content", "id", "status"}),
    "function_call": _CALL_MEMBERS | {"name", "arguments", "status", "async"},
    "function_call_output": _CALL_MEMBERS | {"output", "status", "name"},
    "custom_tool_call": _CALL_MEMBERS | {"name", "input", "async"},
    "custom_tool_call_output": frozenset({"type", "id", "call_id", "output", "caller"}),
    "reasoning": frozenset({"type", "id", "summary", "content", "encrypted_content", "status"}),
    "compaction": frozenset({"type", "id", "encrypted_content", "created_by"}),
    "item_reference": frozenset({"type", "id"}),
}
"""The members each item kind takes (the official SDK's input item params); assistant messages also take `phase`."""

CODEX_ITEM_METADATA = "internal_chat_message_metadata_passthrough"
"""A member Codex CLI (0.171) adds to the messages and tool outputs it sends; OpenAI takes it, as Codex works."""

CALL_OUTPUT_TYPES = {"function_call_output": "function_call", "custom_tool_call_output": "custom_tool_call"}
"""Each client-run tool's output type, mapped to the call type it answers by `call_id`."""

_ID_PREFIXES = {"function_call": "fc", "reasoning": "rs", "message": "msg", "compaction": "cmp"}

_CALL_WORDS = {"function_call": "function call", "custom_tool_call": "custom tool call"}

_REQUIRED_STRINGS: dict[str, tuple[str, ...]] = {
    "function_call": ("call_id", "name", "arguments"),
    "custom_tool_call": ("call_id", "name", "input"),
    "function_call_output": ("call_id",),
    "custom_tool_call_output": ("call_id",),
    "compaction": ("encrypted_content",),
    "item_reference": ("id",),
}

ITEM_TYPES = tuple(
    sorted(
        {
            "message",
            "reasoning",
            "compaction",
            "item_reference",
            *CALL_OUTPUT_TYPES,
            *CALL_OUTPUT_TYPES.values(),
            "file_search_call",
            "web_search_call",
            "computer_call",
            "computer_call_output",
            "code_interpreter_call",
            "image_generation_call",
            "local_shell_call",
            "local_shell_call_output",
            "shell_call",
            "shell_call_output",
            "apply_patch_call",
            "apply_patch_call_output",
            "mcp_list_tools",
            "mcp_approval_request",
            "mcp_approval_response",
            "mcp_call",
            "tool_search_call",
            "tool_search_output",
            "additional_tools",
            "agent_message",
            "compaction_trigger",
            "multi_agent_call",
            "multi_agent_call_output",
            "program",
            "program_output",
        }
    )
)
"""Every `type` an input item may have."""


@dataclass(frozen=True)
class ItemOrigin:
    """What the fake remembers about an output item it issued, to enforce the reasoning rules later.

    `reasoning` is the id of the reasoning item that came before this item in its response (None if none);
    for a reasoning item, `following` is the (id, `item_shape`) of the item right after it in its response.
    """

    response_id: str
    type: str
    reasoning: str | None = None
    following: tuple[str, str] | None = None


def item_type(item: Mapping[str, Any]) -> str:
    """An item's type: its `type`, or "message" for the short form that gives only a `role`."""
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    return str(kind) if isinstance(kind, str) else ""


def item_shape(item: Mapping[str, Any]) -> str:
    """An item's type, with the role for a message ("message:assistant"): what stands in for a stripped id."""
    kind = item_type(item)
    return f"{kind}:{item.get('role')}" if kind == "message" else kind


def normalize_input(value: Any) -> list[dict[str, Any]]:
    """`input` as a list of items: a string becomes one user message, as OpenAI reads it. Validates the shape."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        raise invalid_type("input", "one of a string or array of input items", value)
    validate_items(value)
    return list(value)


def validate_items(items: Sequence[Any]) -> None:
    """Check each item's shape (see the module docstring); raise OpenAI's error for the first bad one."""
    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise invalid_type(where, "an input item", item)
        kind = item_type(item)
        if "type" in item and kind not in ITEM_TYPES:
            raise invalid_value(kind, ITEM_TYPES, where)
        if kind == "message" or "type" not in item:
            _validate_role(where, item)
        _validate_members(where, kind, item)
        _validate_id(where, kind, item.get("id"))
        for field in _REQUIRED_STRINGS.get(kind, ()):
            if not isinstance(item.get(field), str):
                raise missing_parameter(f"{where}.{field}")
        if kind == "message":
            _validate_content(where, item)
        elif kind in CALL_OUTPUT_TYPES and not isinstance(item.get("output"), str | list):
            raise missing_parameter(f"{where}.output")
        elif kind == "reasoning" and not isinstance(item.get("summary"), list):
            raise missing_parameter(f"{where}.summary")


def _validate_role(where: str, message: Mapping[str, Any]) -> None:
    role = message.get("role")
    if role not in MESSAGE_ROLES:
        raise invalid_value(role if isinstance(role, str) else "", MESSAGE_ROLES, where)


def _validate_members(where: str, kind: str, item: Mapping[str, Any]) -> None:
    known = _MEMBERS.get(kind)
    if known is None:
        return
    if kind == "message" and item.get("role") == "assistant":
        known = known | {"phase"}
    for key in item:
        if key not in known and key != CODEX_ITEM_METADATA:
            raise OpenAIError(f"Unknown parameter: '{where}.{key}'.", param=f"{where}.{key}", code="unknown_parameter")


def _validate_id(where: str, kind: str, item_id: Any) -> None:
    prefix = _ID_PREFIXES.get(kind)
    if item_id is None or prefix is None:
        return
    if not isinstance(item_id, str) or not item_id.startswith(prefix):
        raise OpenAIError(
            f"Invalid '{where}.id': '{item_id}'. Expected an ID that begins with '{prefix}'.",
            param=f"{where}.id",
            code="invalid_value",
        )


def check_unique_ids(items: Sequence[Mapping[str, Any]]) -> None:
    """No two items share an `id` (item references aside, whose `id` names another item)."""
    seen: set[str] = set()
    for item in items:
        item_id = item.get("id")
        if not isinstance(item_id, str) or item_type(item) == "item_reference":
            continue
        if item_id in seen:
            raise OpenAIError(
                f"Duplicate item found with id {item_id}. Remove duplicate items from your input and try again.",
                param="input",
            )
        seen.add(item_id)


def _validate_content(where: str, message: Mapping[str, Any]) -> None:
    content = message.get("content")
    if content is None:
        raise missing_parameter(f"{where}.content")
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise invalid_type(f"{where}.content", "one of a string or array of objects", content)
    fitting = _OUTPUT_PART_TYPES if message.get("role") == "assistant" else _INPUT_PART_TYPES
    for k, part in enumerate(content):
        if not isinstance(part, dict):
            raise invalid_type(f"{where}.content[{k}]", "an object", part)
        kind = part.get("type")
        if kind not in CONTENT_PART_TYPES:
            raise invalid_value(str(kind or ""), CONTENT_PART_TYPES, f"{where}.content[{k}].type")
        if kind not in fitting:
            raise invalid_value(str(kind), fitting, f"{where}.content[{k}]")
        text_field = {"input_text": "text", "output_text": "text", "refusal": "refusal"}.get(str(kind))
        if text_field and not isinstance(part.get(text_field), str):
            raise missing_parameter(f"{where}.content[{k}].{text_field}")


def check_pairing(items: Sequence[Mapping[str, Any]]) -> None:
    """Every tool output answers an earlier call of its kind; every call has an output after it."""
    calls: dict[str, str] = {}  # call_id -> call type, in input order
    answered: set[str] = set()
    for item in items:
        kind = item_type(item)
        if kind in _CALL_WORDS:
            calls[str(item["call_id"])] = kind
        elif kind in CALL_OUTPUT_TYPES:
            call_id = str(item["call_id"])
            call_kind = CALL_OUTPUT_TYPES[kind]
            if calls.get(call_id) != call_kind:
                raise OpenAIError(
                    f"No tool call found for {_CALL_WORDS[call_kind]} output with call_id {call_id}.", param="input"
                )
            answered.add(call_id)
    for call_id, kind in calls.items():
        if call_id not in answered:
            raise OpenAIError(f"No tool output found for {_CALL_WORDS[kind]} {call_id}.", param="input")


def check_reasoning(items: Sequence[Mapping[str, Any]], origins: Mapping[str, ItemOrigin]) -> None:
    """Enforce the reasoning rules for items this fake issued (`origins`: item id -> where it came from)."""
    seen: set[str] = set()
    for index, item in enumerate(items):
        item_id = item.get("id")
        origin = origins.get(item_id) if isinstance(item_id, str) else None
        if origin is not None and isinstance(item_id, str):
            if origin.reasoning is not None and origin.reasoning not in seen:
                raise OpenAIError(
                    f"Item '{item_id}' of type '{origin.type}' was provided without its required 'reasoning' item: "
                    f"'{origin.reasoning}'.",
                    param="input",
                )
            if origin.following is not None and not _follows(items, index + 1, origin.following):
                raise OpenAIError(
                    f"Item '{item_id}' of type 'reasoning' was provided without its required following item.",
                    param="input",
                )
            seen.add(item_id)


def _follows(items: Sequence[Mapping[str, Any]], index: int, expected: tuple[str, str]) -> bool:
    if index >= len(items):
        return False
    following = items[index]
    following_id = following.get("id")
    if following_id is None:
        return item_shape(following) == expected[1]
    return bool(following_id == expected[0])
