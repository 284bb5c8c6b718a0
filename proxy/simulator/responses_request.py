r"""The request-level checks the fake upstream's Responses API makes before it looks at the conversation.

Wording, params, codes and their order follow OpenAI's answers as recorded by direct probes of the live API
(status 400 unless said otherwise):

1. `model`: absent is "Missing required parameter: 'model'."; not a string is `invalid_type` ("expected a string",
   `null` reading as "an object"); empty is "The requested model '' does not exist." (code `model_not_found`).
2. `input` absent is "Missing required parameter: 'input'.", before unknown keys.
3. Unknown keys: "Unknown parameter: 'x'." (code `unknown_parameter`), with "Did you mean 'store'?" when a known key
   not in the body is within 2 edits (nearest first, then alphabetical). `messages` gets OpenAI's hint to use `input`.
4. `input`: "Invalid type for 'input': expected one of a string or array of input items, but got ... instead.";
   then its items (`proxy.simulator.responses_items`).
5. The other fields, each in OpenAI's order: `include` values, `tools` (each a typed object; function tools named),
   `metadata`, `text`, `parallel_tool_calls`, `stream`, `stream_options` (only `include_obfuscation`: a Chat
   Completions `include_usage` is an unknown parameter here), `background`, `max_output_tokens` (an integer >= 16),
   `max_tool_calls`, `reasoning`, `user`, `safety_identifier`, `prompt_cache_key`, `truncation`, `instructions`,
   `store`, `top_logprobs`, `context_management`.
6. `previous_response_id` with `conversation` is "Mutually exclusive parameters: ..." (code
   `mutually_exclusive_parameters`). The stored state is looked up next (by `ResponsesService`), and only then is an
   empty `input` refused: "One of \"input\" or \"previous_response_id\" or 'prompt' or 'conversation' must be
   provided." (param null, code `missing_required_parameter`), see `check_not_empty`.

Not modelled: per-model capability refusals (`temperature` on reasoning models, ...), enum checks of fields the fake
does not use (`service_tier`, `reasoning.effort`, ...), `tool_choice` shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.simulator.openai_common import OpenAIError, check_tool_count, invalid_type, invalid_value, missing_parameter

__all__ = ["INCLUDABLE", "KNOWN_PARAMETERS", "check_not_empty", "validate_create_request"]

KNOWN_PARAMETERS = frozenset(
    {
        "access_programs",
        "background",
        "background_options",
        "context_management",
        "conversation",
        "image",
        "include",
        "input",
        "instructions",
        "max_output_tokens",
        "max_tool_calls",
        "metadata",
        "model",
        "moderation",
        "parallel_tool_calls",
        "previous_response_id",
        "prompt",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning",
        "safety_identifier",
        "service_tier",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "truncation",
        "user",
    }
)
"""Every top-level key of a create request (the official SDK's `ResponseCreateParams`)."""

INCLUDABLE = (
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
)
"""The values `include` accepts, in the order OpenAI lists them."""

MAX_OUTPUT_TOKENS_MINIMUM = 16

_MESSAGES_MOVED = (
    "Unsupported parameter: 'messages'. In the Responses API, this parameter has moved to 'input'. Try again with the "
    "new parameter. See the API documentation for more information: "
    "https://platform.openai.com/docs/api-reference/responses/create."
)

_FIELD_TYPES: tuple[tuple[str, str, tuple[type, ...]], ...] = (
    ("metadata", "a metadata object", (dict,)),
    ("text", "an object", (dict,)),
    ("parallel_tool_calls", "a boolean", (bool,)),
    ("stream", "a boolean", (bool,)),
    ("stream_options", "an object", (dict,)),
    ("background", "a boolean", (bool,)),
    ("max_output_tokens", "an integer", (int,)),
    ("max_tool_calls", "an integer", (int,)),
    ("reasoning", "an object", (dict,)),
    ("user", "a string", (str,)),
    ("safety_identifier", "a string", (str,)),
    ("prompt_cache_key", "a string", (str,)),
    ("truncation", "one of 'auto' or 'disabled'", (str,)),
    ("instructions", "a string", (str,)),
    ("store", "a boolean", (bool,)),
    ("top_logprobs", "an integer", (int,)),
    ("context_management", "an array of objects", (list,)),
)
"""Type checks after `include` and `tools`, in the order OpenAI reports them."""


def validate_create_request(body: Mapping[str, Any]) -> None:
    """Refuse a create request as OpenAI does, up to (not including) the stored-state lookups; see the docstring."""
    _check_model(body)
    if "input" not in body:
        raise missing_parameter("input")
    _check_unknown_keys(body)
    value = body["input"]
    if not isinstance(value, str | list):
        expected = "a string" if value is None else "one of a string or array of input items"
        raise invalid_type("input", expected, {} if value is None else value)
    _check_include(body.get("include"))
    _check_tools(body.get("tools"))
    for param, expected, kinds in _FIELD_TYPES:
        value = body.get(param)
        if value is not None and (not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool))):
            raise invalid_type(param, expected, value)
        if param == "stream_options" and isinstance(value, dict):
            _check_members("stream_options", value, {"include_obfuscation"})
        if param == "max_output_tokens" and isinstance(value, int) and value < MAX_OUTPUT_TOKENS_MINIMUM:
            raise OpenAIError(
                f"Invalid 'max_output_tokens': integer below minimum value. Expected a value >= "
                f"{MAX_OUTPUT_TOKENS_MINIMUM}, but got {value} instead.",
                param="max_output_tokens",
                code="integer_below_min_value",
            )
        if param == "truncation" and value not in (None, "auto", "disabled"):
            raise invalid_value(str(value), ("auto", "disabled"), "truncation")
    if body.get("previous_response_id") is not None and body.get("conversation") is not None:
        raise OpenAIError(
            "Mutually exclusive parameters: ''. Ensure you are only providing one of: 'pre..._id' or 'conversation'.",
            code="mutually_exclusive_parameters",
        )


def check_not_empty(body: Mapping[str, Any]) -> None:
    """Refuse an empty `input` when nothing else (stored state) says what to answer."""
    if body.get("input") in ("", []) and not any(body.get(k) for k in ("previous_response_id", "conversation")):
        raise OpenAIError(
            "One of \"input\" or \"previous_response_id\" or 'prompt' or 'conversation' must be provided.",
            code="missing_required_parameter",
        )


def _check_model(body: Mapping[str, Any]) -> None:
    if "model" not in body:
        raise missing_parameter("model")
    model = body["model"]
    if not isinstance(model, str):
        raise invalid_type("model", "a string", {} if model is None else model)
    if not model:
        raise OpenAIError("The requested model '' does not exist.", param="model", code="model_not_found")


def _check_unknown_keys(body: Mapping[str, Any]) -> None:
    for key in body:
        if key in KNOWN_PARAMETERS:
            continue
        if key == "messages":
            raise OpenAIError(_MESSAGES_MOVED, code="unsupported_parameter")
        raise _unknown(key, _suggestions(key, KNOWN_PARAMETERS - set(body)))


def _check_members(where: str, value: Mapping[str, Any], known: set[str]) -> None:
    for key in value:
        if key not in known:
            raise _unknown(f"{where}.{key}", [])


def _unknown(param: str, suggestions: list[str]) -> OpenAIError:
    hint = " Did you mean " + " or ".join(f"'{s}'" for s in suggestions) + "?" if suggestions else ""
    return OpenAIError(f"Unknown parameter: '{param}'.{hint}", param=param, code="unknown_parameter")


def _suggestions(key: str, candidates: frozenset[str]) -> list[str]:
    near = sorted((_edit_distance(key, c), c) for c in candidates)
    return [candidate for distance, candidate in near if distance <= 2]


def _edit_distance(a: str, b: str) -> int:
    previous = list(range(len(b) + 1))
    for i, left in enumerate(a, start=1):
        current = [i]
        for j, right in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (left != right)))
        previous = current
    return previous[-1]


def _check_include(include: Any) -> None:
    if include is None:
        return
    if not isinstance(include, list):
        raise invalid_type("include", "an array of includable values", include)
    for index, value in enumerate(include):
        if value not in INCLUDABLE:
            raise invalid_value(str(value), INCLUDABLE, f"include[{index}]")


def _check_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise invalid_type("tools", "an array of tools", tools)
    check_tool_count(tools)
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise invalid_type(where, "an object", tool)
        if not isinstance(tool.get("type"), str):
            raise missing_parameter(f"{where}.type")
        if tool["type"] in ("function", "custom") and not isinstance(tool.get("name"), str):
            raise missing_parameter(f"{where}.name")
