"""What OpenAI refuses about a chat-completion request, with OpenAI's error bodies.

Its shape, its messages, their tool-call pairing, and a prompt over the model's context window
(`context_length_exceeded`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.simulator.openai_common import (
    OpenAIError,
    check_tool_count,
    invalid_type,
    invalid_value,
    missing_parameter,
)

__all__ = ["VALID_ROLES", "context_length_error", "validate_chat_request"]

VALID_ROLES = ("system", "assistant", "user", "function", "tool", "developer")


def validate_chat_request(body: Mapping[str, Any]) -> None:
    """Reject what OpenAI rejects about a chat-completion request's shape, messages and tool-call pairing."""
    if not body.get("model"):
        raise OpenAIError("you must provide a model parameter")
    messages = body.get("messages")
    if messages is None:
        raise missing_parameter("messages")
    if not isinstance(messages, list):
        raise invalid_type("messages", "an array", messages)
    if not messages:
        raise OpenAIError(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
            param="messages",
            code="empty_array",
        )
    for index, message in enumerate(messages):
        _validate_message(index, message)
    _validate_tool_pairing(messages)
    check_tool_count(body.get("tools"))
    for param in ("max_tokens", "max_completion_tokens"):
        value = body.get(param)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise invalid_type(param, "an integer", value)
    if body.get("stream_options") is not None and not body.get("stream"):
        raise OpenAIError(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.", param="stream_options"
        )


def _validate_message(index: int, message: object) -> None:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise invalid_type(where, "an object", message)
    role = message.get("role")
    if role is None:
        raise missing_parameter(f"{where}.role")
    if role not in VALID_ROLES:
        raise invalid_value(str(role), VALID_ROLES, f"{where}.role")
    content = message.get("content")
    if "content" not in message and role in ("system", "developer", "user", "tool"):
        raise missing_parameter(f"{where}.content")
    if content is not None and not isinstance(content, str | list):
        raise invalid_type(f"{where}.content", "one of a string or array of objects", content)
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise missing_parameter(f"{where}.tool_call_id")
    for k, call in enumerate(message.get("tool_calls") or ()):
        _validate_tool_call(f"{where}.tool_calls[{k}]", call)


def _validate_tool_call(where: str, call: object) -> None:
    if not isinstance(call, dict):
        raise invalid_type(where, "an object", call)
    if not isinstance(call.get("id"), str):
        raise missing_parameter(f"{where}.id")
    function = call.get("function")
    if not isinstance(function, dict):
        raise missing_parameter(f"{where}.function")
    if not isinstance(function.get("name"), str):
        raise missing_parameter(f"{where}.function.name")


def _validate_tool_pairing(messages: Sequence[Mapping[str, Any]]) -> None:
    """Every tool message answers a call of the assistant message just before its run; every call is answered."""
    open_index: int | None = None
    open_ids: list[str] = []
    pending: set[str] = set()
    for index, message in enumerate(messages):
        role = message["role"]
        if role == "tool":
            if open_index is None:
                raise OpenAIError(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with "
                    "'tool_calls'.",
                    param=f"messages.[{index}].role",
                )
            call_id = message["tool_call_id"]
            if call_id not in open_ids:
                raise OpenAIError(
                    f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in 'tool_calls' of previous message.",
                    param=f"messages.[{index}].tool_call_id",
                )
            pending.discard(call_id)
            continue
        _raise_if_unanswered(open_index, open_ids, pending)
        open_index, open_ids = None, []
        if role == "assistant" and message.get("tool_calls"):
            open_index = index
            open_ids = [call["id"] for call in message["tool_calls"]]
            pending = set(open_ids)
    _raise_if_unanswered(open_index, open_ids, pending)


def _raise_if_unanswered(open_index: int | None, open_ids: list[str], pending: set[str]) -> None:
    if open_index is None or not pending:
        return
    missing = ", ".join(call_id for call_id in open_ids if call_id in pending)
    raise OpenAIError(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
        f"'tool_call_id'. The following tool_call_ids did not have response messages: {missing}",
        param=f"messages.[{open_index}].role",
    )


def context_length_error(window: int, prompt_tokens: int, completion_tokens: int) -> OpenAIError:
    """OpenAI's `context_length_exceeded` error, in its messages-only or messages-plus-completion wording."""
    if completion_tokens:
        total = prompt_tokens + completion_tokens
        detail = (
            f"However, you requested {total} tokens ({prompt_tokens} in the messages, {completion_tokens} in the "
            "completion). Please reduce the length of the messages or completion."
        )
    else:
        detail = f"However, your messages resulted in {prompt_tokens} tokens. Please reduce the length of the messages."
    return OpenAIError(
        f"This model's maximum context length is {window} tokens. {detail}",
        param="messages",
        code="context_length_exceeded",
    )
