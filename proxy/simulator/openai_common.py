"""What every route of the fake OpenAI upstream shares: OpenAI's error bodies, JSON bodies, ids and token pieces.

Split out of `proxy.simulator.openai_upstream` so the chat-completions route and the Responses API modules
(`proxy.simulator.responses_api` and its neighbours) use one implementation of each without importing each other.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from proxy.engine.encodings import get_encoding
from proxy.simulator.openai_tokens import encode

__all__ = [
    "OpenAIError",
    "invalid_type",
    "invalid_value",
    "json_response",
    "missing_parameter",
    "parse_json_body",
    "split_into_token_pieces",
    "tool_call_id",
]

_INVALID_JSON_MESSAGE = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library "
    "correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)"
)


class OpenAIError(Exception):
    """An error the fake answers with OpenAI's body: `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}

    def response(self) -> web.Response:
        """Render as the HTTP response OpenAI would send."""
        return json_response(self.body, status=self.status)


def missing_parameter(param: str) -> OpenAIError:
    """OpenAI's error for a required parameter that was not sent."""
    return OpenAIError(f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")


MAX_TOOLS = 128
"""The most tools OpenAI accepts on one request, chat completions and Responses alike."""


def check_tool_count(tools: object) -> None:
    """OpenAI's refusal of a `tools` array longer than `MAX_TOOLS`."""
    if isinstance(tools, list) and len(tools) > MAX_TOOLS:
        raise OpenAIError(
            f"Invalid 'tools': array too long. Expected an array with maximum length {MAX_TOOLS}, but got an array "
            f"with length {len(tools)} instead.",
            param="tools",
            code="array_above_max_length",
        )


def invalid_type(param: str, expected: str, value: object) -> OpenAIError:
    """OpenAI's error for a parameter of the wrong JSON type (`expected` as OpenAI words it: "an array")."""
    got = _json_type_name(value)
    return OpenAIError(
        f"Invalid type for '{param}': expected {expected}, but got {got} instead.", param=param, code="invalid_type"
    )


def invalid_value(value: str, supported: Sequence[str], param: str) -> OpenAIError:
    """OpenAI's enum error, listing "'a' and 'b'" for two values, "'a', 'b', and 'c'" for more."""
    quoted = [f"'{v}'" for v in supported]
    listed = " and ".join(quoted) if len(quoted) == 2 else ", ".join(quoted[:-1]) + f", and {quoted[-1]}"
    return OpenAIError(f"Invalid value: '{value}'. Supported values are: {listed}.", param=param, code="invalid_value")


def _json_type_name(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer"}
    if value is None:
        return "null"
    return names.get(type(value), "a decimal")


def parse_json_body(raw: bytes) -> dict[str, Any]:
    """Parse a request body that must be a JSON object, or raise OpenAI's "could not parse" error."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nesting deeper than Python's stack
        raise OpenAIError(_INVALID_JSON_MESSAGE) from None
    if not isinstance(body, dict):
        raise OpenAIError(_INVALID_JSON_MESSAGE)
    return body


def json_response(body: Any, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """Answer `body` as OpenAI does: indented JSON, non-ASCII kept."""
    text = json.dumps(body, indent=2, ensure_ascii=False)
    return web.Response(text=text, status=status, headers=headers, content_type="application/json")


def tool_call_id(*parts: object) -> str:
    """Make a deterministic OpenAI-looking tool call id ("call_" + 24 characters) from `parts`."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()
    return f"call_{digest[:24]}"


def split_into_token_pieces(text: str, encoding_name: str, tokens_per_piece: int = 1) -> list[str]:
    """Split `text` at token boundaries, as a model streams it, never inside a UTF-8 character."""
    encoding = get_encoding(encoding_name)
    pieces: list[str] = []
    pending = b""
    for count, token in enumerate(encode(text, encoding_name), start=1):
        pending += encoding.decode_single_token_bytes(token)
        if count % tokens_per_piece:
            continue
        try:
            pieces.append(pending.decode())
        except UnicodeDecodeError:
            continue
        pending = b""
    if pending:
        pieces.append(pending.decode(errors="replace"))
    return pieces
