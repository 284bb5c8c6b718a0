"""A fake OpenAI Chat Completions server on loopback, so end-to-end tests and benchmarks of the proxy are honest.

`OpenAIUpstream` is a real aiohttp server on 127.0.0.1 that answers like OpenAI's API: it validates requests with
OpenAI's error bodies (including the tool-call pairing rules and `context_length_exceeded`), counts prompt tokens
itself with tiktoken (see `tests.support.openai_tokens`), simulates prompt caching, streams Server-Sent Events the
way OpenAI does, and records every request it receives so tests can assert exactly what the proxy forwarded.

Use it in-process::

    async with OpenAIUpstream(context_window=8192, responder=tool_loop_responder("search", steps=3)) as upstream:
        client = AsyncOpenAI(base_url=upstream.base_url + "/v1", api_key="sk-test")
        ...
        assert upstream.requests[-1].json["messages"] == ...

or as its own process (for benchmarks)::

    python -m tests.support.openai_upstream --port 0 --context-window 8192

which prints the base URL on stdout once it is listening.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gzip
import hashlib
import itertools
import json
import signal
import struct
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy

from proxy.engine.encodings import get_encoding
from tests.support.openai_common import (
    OpenAIError,
    check_tool_count,
    invalid_type,
    invalid_value,
    json_response,
    missing_parameter,
    parse_json_body,
    split_into_token_pieces,
    tool_call_id,
)
from tests.support.openai_tokens import (
    PromptCache,
    count_completion_tokens,
    count_text,
    encode,
    encoding_name_for_model,
    prompt_token_sequence,
)
from tests.support.responses_api import ResponsesResponder, response_object, responses_tool_loop_responder
from tests.support.responses_server import ResponsesService
from tests.support.responses_socket import echo_socket, is_upgrade, recorded_fields, responses_socket
from tests.support.responses_stream import error_events, response_events, sse_frame

__all__ = [
    "DEFAULT_MODELS",
    "Failure",
    "OpenAIError",
    "OpenAIUpstream",
    "RecordedRequest",
    "Reply",
    "Responder",
    "ToolCall",
    "context_length_error",
    "default_responder",
    "deterministic_bytes",
    "embedding_vector",
    "fixed_responder",
    "parse_json_body",
    "split_into_token_pieces",
    "stream_chunks",
    "tool_call_id",
    "tool_loop_responder",
    "validate_chat_request",
]

DEFAULT_CONTEXT_WINDOW = 128_000
DEFAULT_MODELS = ("gpt-4o-mini", "gpt-4o", "gpt-4.1", "gpt-4.1-mini", "text-embedding-3-small")
VALID_ROLES = ("system", "assistant", "user", "function", "tool", "developer")
SYSTEM_FINGERPRINT = "fp_fakeupstrm"
MODEL_CREATED = 1_715_367_049
MAX_BODY_BYTES = 256 * 1024 * 1024

_CUT_AFTER_CHUNKS = web.RequestKey("cut_after_chunks", int)
"""Set on a request whose scripted failure cuts its stream after that many chunks."""


# --------------------------------------------------------------------------------------------------------------------
# Replies and responders
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """One function call the fake model makes: `arguments` is the JSON text, as OpenAI returns it."""

    id: str
    name: str
    arguments: str = "{}"


@dataclass(frozen=True)
class Reply:
    """What the fake model answers: text, tool calls, or both (tool calls make finish_reason "tool_calls")."""

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()


Responder = Callable[[dict[str, Any]], Reply]
"""Maps the parsed chat-completion request body to the reply. Must be deterministic for tests to be."""


def default_responder(request: dict[str, Any]) -> Reply:
    """Answer with a short text that depends on the request: "ok <n> messages"."""
    return Reply(content=f"ok {len(request['messages'])} messages")


def fixed_responder(text: str) -> Responder:
    """Always answer with `text`."""

    def respond(request: dict[str, Any]) -> Reply:
        return Reply(content=text)

    return respond


def tool_loop_responder(
    tool_name: str = "run",
    steps: int = 3,
    *,
    parallel: int = 1,
    arguments: Callable[[int, int], Mapping[str, Any]] | None = None,
    final_text: str | None = None,
) -> Responder:
    """Drive an agent loop: answer a user message with tool calls, each round of tool results with more, then text.

    After the latest user message the fake model makes `steps` assistant turns, each with `parallel` calls of
    `tool_name` (so `steps * parallel` calls in all), then answers `final_text` (default "done: <n> tool calls").
    Arguments default to `{"step": s, "call": k}`; pass `arguments(step, k)` for bigger ones. Call ids are unique
    within a conversation and derived only from the conversation, so a replayed request gets the same ids.
    """

    def respond(request: dict[str, Any]) -> Reply:
        messages: list[dict[str, Any]] = request["messages"]
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
        made = sum(1 for m in messages[last_user + 1 :] if m.get("role") == "assistant" and m.get("tool_calls"))
        last_role = messages[-1].get("role")
        if made >= steps or last_role not in ("user", "tool"):
            return Reply(content=final_text if final_text is not None else f"done: {made * parallel} tool calls")
        step = made + 1
        turn = sum(1 for m in messages if m.get("role") == "user")
        anchor = _text_of(messages[last_user]) if last_user >= 0 else ""
        calls = tuple(
            ToolCall(
                id=tool_call_id(turn, anchor, step, k),
                name=tool_name,
                arguments=json.dumps(dict(arguments(step, k)) if arguments else {"step": step, "call": k}),
            )
            for k in range(parallel)
        )
        return Reply(tool_calls=calls)

    return respond


def _text_of(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


# --------------------------------------------------------------------------------------------------------------------
# Errors and validation
# --------------------------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------------------------
# Building responses
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Completion:
    """A served completion, from which both the JSON response and the SSE chunks are rendered."""

    id: str
    created: int
    model: str
    reply: Reply
    finish_reason: str
    usage: dict[str, Any]

    def header(self, obj: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "service_tier": "default",
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }

    def to_json(self) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": self.reply.content,
            "refusal": None,
            "annotations": [],
        }
        if self.reply.tool_calls:
            message["tool_calls"] = [_tool_call_json(call) for call in self.reply.tool_calls]
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish_reason}
        return {**self.header("chat.completion"), "choices": [choice], "usage": self.usage}


def _tool_call_json(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _truncate_reply(reply: Reply, limit: int | None, encoding_name: str) -> tuple[Reply, str]:
    """Apply max_completion_tokens to the text like OpenAI does: cut it and report finish_reason "length"."""
    finish_reason = "tool_calls" if reply.tool_calls else "stop"
    if not limit or not reply.content:
        return reply, finish_reason
    tokens = encode(reply.content, encoding_name)
    if len(tokens) <= limit:
        return reply, finish_reason
    text = get_encoding(encoding_name).decode(list(tokens[:limit]))
    return Reply(content=text, tool_calls=reply.tool_calls), "length"


def stream_chunks(
    completion: _Completion, *, include_usage: bool, encoding_name: str, tokens_per_chunk: int = 1
) -> Iterator[dict[str, Any]]:
    """Yield the `chat.completion.chunk` objects OpenAI streams for `completion`, in order."""
    header = completion.header("chat.completion.chunk")

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        body = {**header, "choices": [choice]}
        if include_usage:
            body["usage"] = None
        return body

    reply = completion.reply
    yield chunk({"role": "assistant", "content": "" if reply.content is not None else None, "refusal": None})
    for piece in split_into_token_pieces(reply.content or "", encoding_name, tokens_per_chunk):
        yield chunk({"content": piece})
    for index, call in enumerate(reply.tool_calls):
        opening = {"index": index, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
        yield chunk({"tool_calls": [opening]})
        for fragment in split_into_token_pieces(call.arguments, encoding_name, max(tokens_per_chunk, 2)):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]})
    yield chunk({}, completion.finish_reason)
    if include_usage:
        yield {**header, "choices": [], "usage": completion.usage}


_SSE_DONE = b"data: [DONE]\n\n"


def _sse_event(chunk: Mapping[str, Any]) -> bytes:
    """One SSE event as OpenAI frames it: `data: <compact JSON>` and a blank line."""
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


def _sse_body(chunks: Iterable[Mapping[str, Any]]) -> bytes:
    """The whole SSE body for `chunks`, `[DONE]` included, exactly as `_stream` sends it."""
    return b"".join(_sse_event(chunk) for chunk in chunks) + _SSE_DONE


# --------------------------------------------------------------------------------------------------------------------
# Embeddings and echo helpers
# --------------------------------------------------------------------------------------------------------------------


def deterministic_bytes(size: int, seed: str = "echo") -> bytes:
    """Return `size` pseudo-random bytes that depend only on `size` and `seed` (the echo endpoint's large bodies)."""
    return hashlib.shake_256(f"{seed}:{size}".encode()).digest(size) if size else b""


def embedding_vector(text: str, model: str, dimensions: int) -> list[float]:
    """A deterministic unit vector for `text`: equal inputs embed equally, different ones (almost surely) not."""
    raw = hashlib.shake_256(f"{model}\x1f{text}".encode()).digest(4 * dimensions)
    values = [v / 2**31 - 1.0 for v in struct.unpack(f"<{dimensions}I", raw)]
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    return [v / norm for v in values]


def _embedding_inputs(value: object) -> list[str]:
    """Normalize an embeddings `input`: a string, strings, a token array or token arrays, to one key per item."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [json.dumps(value)]
    if isinstance(value, list) and value and all(isinstance(v, str | list) for v in value):
        return [v if isinstance(v, str) else json.dumps(v) for v in value]
    raise OpenAIError("'$.input' is invalid. Please check the API reference.", param="input")


# --------------------------------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the fake received it, byte for byte."""

    method: str
    path: str
    raw_path: str
    query_string: str
    query: MultiDictProxy[str]
    headers: CIMultiDictProxy[str]
    body: bytes
    json: Any | None


@dataclass(frozen=True)
class Failure:
    """A scripted failure for the next request (see `OpenAIUpstream.fail_next`)."""

    status: int = 500
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    reset: bool = False
    cut_after_chunks: int | None = None
    delay: float = 0.0


_DEFAULT_FAILURE_BODIES: dict[int, tuple[str, str, str | None]] = {
    429: ("Rate limit reached for requests. Please try again later.", "requests", "rate_limit_exceeded"),
    500: ("The server had an error while processing your request. Sorry about that!", "server_error", None),
    502: ("Bad gateway.", "server_error", None),
    503: ("The engine is currently overloaded, please try again later.", "server_error", None),
}


def _failure_body(failure: Failure) -> Any:
    if failure.body is not None:
        return failure.body
    message, kind, code = _DEFAULT_FAILURE_BODIES.get(
        failure.status, (f"Simulated upstream failure {failure.status}.", "server_error", None)
    )
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _failure_response(failure: Failure) -> web.Response:
    body = _failure_body(failure)
    headers = CIMultiDict(failure.headers)
    if isinstance(body, bytes | str):
        return web.Response(
            body=body.encode() if isinstance(body, str) else body, status=failure.status, headers=headers
        )
    return json_response(body, status=failure.status, headers=headers)


class OpenAIUpstream:
    """An OpenAI-compatible fake server on loopback: chat completions, models, embeddings and an echo endpoint.

    :param responder: Maps each valid chat-completion request body to the reply; `default_responder` if None.
        Reassignable at any time (`upstream.responder = ...`).
    :param context_window: Window of any model not in `context_windows`.
    :param context_windows: Per-model windows; an exact model name wins, else the longest key the name starts with.
    :param models: Ids listed by `GET /v1/models` (default: `DEFAULT_MODELS` plus the keys of `context_windows`).
    :param host: Interface to bind; loopback by default.
    :param port: Port to bind; 0 picks a free one (read `base_url` after `start()`).
    :param delay_first_byte: Seconds to wait before answering any request (a slow upstream).
    :param stream_chunk_delay: Seconds to wait between SSE chunks.
    :param stream_tokens_per_chunk: Tokens of content per SSE chunk.
    :param cut_stream_after: If set, every stream is cut (connection reset) after this many chunks.
    :param cache_max_blocks: Bound on remembered 128-token prompt blocks for simulated prompt caching.
    :param responses_responder: Maps each valid Responses API request (as the model sees it) to the reply;
        `default_responses_responder` if None. Reassignable (`upstream.responses_responder = ...`).
    :param responses_overflow_in_stream: Refuse a streamed Responses request over the window inside the stream
        (`response.created`, `response.in_progress`, then an `error` event), as OpenAI does for some models,
        instead of with a 400 before the stream.
    :param chat_overflow_in_stream: Refuse a streamed chat completion over the window inside a 200 stream (one
        `data: {"error": {...}}` event), as some OpenAI-compatible servers do, instead of with a 400.
    :param stream_digests: Add `X-Stream-Sha256` (sha256 of the SSE body about to be sent, when not cut) and
        `X-Stream-Sha256-Without-Usage` (of the body the same completion would have had without
        `stream_options.include_usage`) to every streamed answer, so a test can check relayed streams byte for byte
        even when the fake runs in another process.

    The Responses API (`POST /v1/responses`, `/v1/responses/compact`, `/v1/responses/input_tokens` and
    `/v1/conversations`; creating and compacting also at the ChatGPT backend's `/backend-api/codex/responses`) is
    served by `responses_service` (see `tests.support.responses_server` for its rules); `responses_requests` lists its
    parsed create bodies and `responses_usages` the usage of each response or compaction it answered. `fail_next`
    and `misreport_usage_next` apply to it too.

    Observations besides `requests`: `streams_started`, `streams_completed` and `streams_aborted` count streamed
    answers begun, sent whole, and broken off because the client (the proxy) went away mid-stream; `abort_event`
    is set on each abort, so a test can wait for the disconnect to reach the upstream. `socket_closes` lists the
    close code of every echo WebSocket once it closed, and `socket_closed` is set then.
    """

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        context_window: int = DEFAULT_CONTEXT_WINDOW,
        context_windows: Mapping[str, int] | None = None,
        models: Sequence[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        delay_first_byte: float = 0.0,
        stream_chunk_delay: float = 0.0,
        stream_tokens_per_chunk: int = 1,
        cut_stream_after: int | None = None,
        cache_max_blocks: int = 200_000,
        stream_digests: bool = False,
        responses_responder: ResponsesResponder | None = None,
        responses_overflow_in_stream: bool = False,
        chat_overflow_in_stream: bool = False,
    ) -> None:
        self.responder: Responder = responder or default_responder
        self.context_window = context_window
        self.context_windows: dict[str, int] = dict(context_windows or {})
        self.models: list[str] = list(models or dict.fromkeys([*DEFAULT_MODELS, *self.context_windows]))
        self.delay_first_byte = delay_first_byte
        self.stream_chunk_delay = stream_chunk_delay
        self.stream_tokens_per_chunk = stream_tokens_per_chunk
        self.cut_stream_after = cut_stream_after
        self.stream_digests = stream_digests
        self.streams_started = 0
        self.streams_completed = 0
        self.streams_aborted = 0
        self.abort_event = asyncio.Event()
        self.requests: list[RecordedRequest] = []
        self.usages: list[dict[str, Any]] = []
        self.prompt_cache = PromptCache(cache_max_blocks)
        self.responses_service = ResponsesService(self.prompt_cache, self.window_for)
        if responses_responder is not None:
            self.responses_service.responder = responses_responder
        self.responses_overflow_in_stream = responses_overflow_in_stream
        self.chat_overflow_in_stream = chat_overflow_in_stream
        self.responses_usages: list[dict[str, Any]] = []
        self.socket_closes: list[int | None] = []
        self.socket_closed = asyncio.Event()
        self._host = host
        self._port = port
        self._failures: deque[Failure] = deque()
        self._misreports: deque[dict[str, int]] = deque()
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._bound_port: int | None = None

    # ---- lifecycle -------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind and start serving; afterwards `base_url` is set."""
        if self._runner is not None:
            raise RuntimeError("OpenAIUpstream is already started")
        runner = web.AppRunner(self._make_app(), access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port)
        await site.start()
        self._runner = runner
        self._bound_port = int(runner.addresses[0][1])

    async def close(self) -> None:
        """Stop serving and close every connection."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def port(self) -> int:
        """The port the server listens on."""
        if self._bound_port is None:
            raise RuntimeError("OpenAIUpstream is not started")
        return self._bound_port

    @property
    def base_url(self) -> str:
        """`http://host:port`, without `/v1` (the OpenAI SDK's base_url is `base_url + "/v1"`)."""
        return f"http://{self._host}:{self.port}"

    # ---- knobs and observations ------------------------------------------------------------------------------------

    def fail_next(
        self,
        status: int = 500,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        *,
        times: int = 1,
        reset: bool = False,
        cut_after_chunks: int | None = None,
        delay: float = 0.0,
    ) -> None:
        """Script the next `times` requests (of any route, in arrival order) to fail.

        By default each gets `status` with `body` (an OpenAI error body matching the status if None; a dict is sent
        as JSON, str/bytes as is) and `headers` (e.g. `{"retry-after": "2"}`). With `reset=True` the connection is
        dropped instead, with no response. With `cut_after_chunks=N` the request is served, but a streamed response
        is cut (connection reset) after N chunks. `delay` waits that many seconds first.
        """
        failure = Failure(
            status=status,
            body=body,
            headers=dict(headers or {}),
            reset=reset,
            cut_after_chunks=cut_after_chunks,
            delay=delay,
        )
        self._failures.extend([failure] * times)

    def misreport_usage_next(self, **usage: int) -> None:
        """Make the next chat completion or response answered report these `usage` fields instead of its counted ones.

        E.g. `misreport_usage_next(prompt_tokens=10**15, total_tokens=10**15)`: a broken or hostile provider's usage
        report, once; the request is served normally otherwise. Pending misreports are forgotten by `clear()`.
        """
        self._misreports.append(dict(usage))

    def window_for(self, model: str) -> int:
        """The context window enforced for `model`."""
        if model in self.context_windows:
            return self.context_windows[model]
        prefixes = [key for key in self.context_windows if model.startswith(key)]
        return self.context_windows[max(prefixes, key=len)] if prefixes else self.context_window

    def clear(self) -> None:
        """Forget recorded requests and usages, scripted failures and misreports, the prompt cache, stored responses."""
        self.requests.clear()
        self.usages.clear()
        self._failures.clear()
        self._misreports.clear()
        self.prompt_cache.clear()
        self.responses_service.clear()
        self.responses_usages.clear()

    @property
    def responses_responder(self) -> ResponsesResponder:
        """The responder of the Responses API; assign to change it."""
        return self.responses_service.responder

    @responses_responder.setter
    def responses_responder(self, responder: ResponsesResponder) -> None:
        self.responses_service.responder = responder

    @property
    def responses_requests(self) -> list[dict[str, Any]]:
        """Parsed bodies of every `POST /v1/responses` request received, in order (valid or not)."""
        return [r.json for r in self.requests if r.path == "/v1/responses" and isinstance(r.json, dict)]

    @property
    def chat_requests(self) -> list[dict[str, Any]]:
        """Parsed bodies of every chat-completion request received, in order (valid or not)."""
        return [r.json for r in self.requests if r.path.endswith("/chat/completions") and isinstance(r.json, dict)]

    # ---- application -----------------------------------------------------------------------------------------------

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[self._observe_and_inject])
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_post("/openai/deployments/{deployment}/chat/completions", self._chat_completions)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/responses", self._responses_socket)
        app.router.add_post("/v1/responses/compact", self._responses_compact)
        app.router.add_post("/v1/responses/input_tokens", self._responses_input_tokens)
        app.router.add_post("/v1/conversations", self._create_conversation)
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_get("/v1/models/{model}", self._get_model)
        app.router.add_post("/v1/embeddings", self._embeddings)
        # The ChatGPT backend Codex CLI talks to with a ChatGPT login: the Responses API (and its WebSocket mode) there.
        app.router.add_post("/backend-api/codex/responses", self._responses)
        app.router.add_get("/backend-api/codex/responses", self._responses_socket)
        app.router.add_post("/backend-api/codex/responses/compact", self._responses_compact)
        app.router.add_post("/openai/deployments/{deployment}/embeddings", self._embeddings)
        app.router.add_route("*", "/echo/{tail:.*}", self._echo)
        app.router.add_route("*", "/{tail:.*}", self._unknown_route)
        return app

    @web.middleware
    async def _observe_and_inject(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Record the request, apply scripted failures and delays, and render `OpenAIError`s."""
        body = await request.read()
        self.requests.append(_record(request, body))
        failure = self._failures.popleft() if self._failures else None
        delay = self.delay_first_byte + (failure.delay if failure else 0.0)
        if delay:
            await asyncio.sleep(delay)
        if failure is not None:
            if failure.cut_after_chunks is not None:
                request[_CUT_AFTER_CHUNKS] = failure.cut_after_chunks
            elif failure.reset:
                _drop_connection(request)
                return web.Response()
            else:
                return _failure_response(failure)
        try:
            return await handler(request)
        except OpenAIError as error:
            return error.response()

    async def _unknown_route(self, request: web.Request) -> web.Response:
        return OpenAIError(f"Invalid URL ({request.method} {request.path})", status=404).response()

    # ---- chat completions ------------------------------------------------------------------------------------------

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = parse_json_body(await request.read())
        deployment = request.match_info.get("deployment")
        if deployment and not body.get("model"):
            body["model"] = deployment
        validate_chat_request(body)
        model = str(body["model"])
        encoding_name = encoding_name_for_model(model)
        sequence = prompt_token_sequence(body, encoding_name)
        completion_budget = int(body.get("max_completion_tokens") or body.get("max_tokens") or 0)
        window = self.window_for(model)
        if len(sequence) + completion_budget > window:
            error = context_length_error(window, len(sequence), completion_budget)
            if body.get("stream") and self.chat_overflow_in_stream:
                return await self._send_events(request, [_sse_event(error.body)], b"", {})
            raise error
        cached = self.prompt_cache.cached_tokens(model, sequence)
        completion = self._complete(
            body,
            model=model,
            encoding_name=encoding_name,
            prompt_tokens=len(sequence),
            cached=cached,
            limit=completion_budget,
        )
        self.usages.append(completion.usage)
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await self._stream(request, completion, include_usage, encoding_name)
        return json_response(completion.to_json(), headers=self._response_headers())

    def _complete(
        self, body: dict[str, Any], *, model: str, encoding_name: str, prompt_tokens: int, cached: int, limit: int
    ) -> _Completion:
        reply, finish_reason = _truncate_reply(self.responder(body), limit or None, encoding_name)
        calls = [(call.name, call.arguments) for call in reply.tool_calls]
        completion_tokens = count_completion_tokens(reply.content, calls, encoding_name)
        serial = next(self._ids)
        misreport = self._misreports.popleft() if self._misreports else {}
        return _Completion(
            id=f"chatcmpl-{hashlib.sha256(f'completion:{serial}'.encode()).hexdigest()[:29]}",
            created=int(time.time()),
            model=model,
            reply=reply,
            finish_reason=finish_reason,
            usage={**_usage(prompt_tokens, completion_tokens, cached), **misreport},
        )

    async def _stream(
        self, request: web.Request, completion: _Completion, include_usage: bool, encoding_name: str
    ) -> web.StreamResponse:
        """Stream `completion` as chat-completion chunks, then `[DONE]`."""
        chunks = list(
            stream_chunks(
                completion,
                include_usage=include_usage,
                encoding_name=encoding_name,
                tokens_per_chunk=self.stream_tokens_per_chunk,
            )
        )
        digests: dict[str, str] = {}
        if self.stream_digests:
            plain = stream_chunks(
                completion,
                include_usage=False,
                encoding_name=encoding_name,
                tokens_per_chunk=self.stream_tokens_per_chunk,
            )
            digests["X-Stream-Sha256"] = hashlib.sha256(_sse_body(chunks)).hexdigest()
            digests["X-Stream-Sha256-Without-Usage"] = hashlib.sha256(_sse_body(plain)).hexdigest()
        return await self._send_events(request, [_sse_event(chunk) for chunk in chunks], _SSE_DONE, digests)

    async def _send_events(
        self, request: web.Request, frames: Sequence[bytes], trailer: bytes, headers: Mapping[str, str]
    ) -> web.StreamResponse:
        """Send SSE `frames`, each its own write, then `trailer`; cut the connection if a fault says so.

        A client that goes away mid-stream (a write fails, or the handler is cancelled) counts in `streams_aborted`.
        """
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
        )
        for name, value in {**self._response_headers(), **headers}.items():
            response.headers[name] = value
        self.streams_started += 1
        cut_after = request.get(_CUT_AFTER_CHUNKS, self.cut_stream_after)
        try:
            await response.prepare(request)
            for sent, frame in enumerate(frames):
                if cut_after is not None and sent >= cut_after:
                    _drop_connection(request)
                    return response
                if sent and self.stream_chunk_delay:
                    await asyncio.sleep(self.stream_chunk_delay)
                await response.write(frame)
            if trailer:
                await response.write(trailer)
            await response.write_eof()
        except ConnectionResetError:
            self._aborted()  # The client (or the proxy under test) went away mid-stream: nothing left to send to.
            return response
        except asyncio.CancelledError:
            self._aborted()
            raise
        self.streams_completed += 1
        return response

    # ---- responses -------------------------------------------------------------------------------------------------

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = parse_json_body(await request.read())
        response_id = self.responses_service.new_response_id()
        misreport = self._misreports[0] if self._misreports else {}
        streamed = body.get("stream") is True
        try:
            response = self.responses_service.create(body, response_id, misreport)
        except OpenAIError as error:
            overflow = error.body["error"]["code"] == "context_length_exceeded"
            if streamed and overflow and self.responses_overflow_in_stream:
                shell = response_object(response_id, body, [], None, status="in_progress")
                return await self._send_response_events(request, error_events(shell, error.body["error"]))
            raise
        if misreport:
            self._misreports.popleft()
        self.responses_usages.append(response["usage"])
        if not streamed:
            return json_response(response, headers=self._response_headers())
        encoding_name = encoding_name_for_model(str(body["model"]))
        return await self._send_response_events(
            request, response_events(response, encoding_name, self.stream_tokens_per_chunk)
        )

    async def _responses_socket(self, request: web.Request) -> web.StreamResponse:
        """The Responses API's WebSocket mode (`tests.support.responses_socket`)."""
        if not is_upgrade(request):
            return await self._unknown_route(request)
        return await responses_socket(
            request, self.responses_service, self._record_message, self.responses_usages, self.stream_tokens_per_chunk
        )

    def _socket_closed(self, code: int | None) -> None:
        self.socket_closes.append(code)
        self.socket_closed.set()

    def _record_message(self, request: web.Request, message: bytes, body: dict[str, Any]) -> None:
        self.requests.append(RecordedRequest(**recorded_fields(request, message, body)))

    async def _send_response_events(
        self, request: web.Request, events: Sequence[Mapping[str, Any]]
    ) -> web.StreamResponse:
        return await self._send_events(request, [sse_frame(event) for event in events], b"", {})

    async def _responses_compact(self, request: web.Request) -> web.Response:
        compacted = self.responses_service.compact(parse_json_body(await request.read()))
        self.responses_usages.append(compacted["usage"])
        return json_response(compacted, headers=self._response_headers())

    async def _responses_input_tokens(self, request: web.Request) -> web.Response:
        counted = self.responses_service.count(parse_json_body(await request.read()))
        return json_response(counted, headers=self._response_headers())

    async def _create_conversation(self, request: web.Request) -> web.Response:
        created = self.responses_service.create_conversation(parse_json_body(await request.read()))
        return json_response(created, headers=self._response_headers())

    def _aborted(self) -> None:
        self.streams_aborted += 1
        self.abort_event.set()

    def _response_headers(self) -> dict[str, str]:
        return {
            "x-request-id": f"req_{hashlib.sha256(str(len(self.requests)).encode()).hexdigest()[:32]}",
            "openai-processing-ms": "1",
            "openai-version": "2020-10-01",
        }

    # ---- models and embeddings -------------------------------------------------------------------------------------

    async def _list_models(self, request: web.Request) -> web.Response:
        return json_response({"object": "list", "data": [_model_json(m) for m in self.models]})

    async def _get_model(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        if model not in self.models:
            raise OpenAIError(f"The model '{model}' does not exist", status=404, param="model", code="model_not_found")
        return json_response(_model_json(model))

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = parse_json_body(await request.read())
        model = str(body.get("model") or request.match_info.get("deployment") or "")
        if not model:
            raise OpenAIError("you must provide a model parameter")
        if "input" not in body:
            raise missing_parameter("input")
        texts = _embedding_inputs(body["input"])
        dimensions = int(body.get("dimensions") or (3072 if "large" in model else 1536))
        as_base64 = body.get("encoding_format") == "base64"
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": _encode_vector(embedding_vector(t, model, dimensions), as_base64),
            }
            for i, t in enumerate(texts)
        ]
        tokens = sum(count_text(t, "cl100k_base") for t in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return json_response({"object": "list", "data": data, "model": model, "usage": usage})

    # ---- echo ------------------------------------------------------------------------------------------------------

    async def _echo(self, request: web.Request) -> web.StreamResponse:
        """Describe the request received, or send a large deterministic body; optionally gzip it or chunk it.

        A WebSocket upgrade is answered by an echo socket instead (`tests.support.responses_socket.echo_socket`).

        Query knobs: `size=N` answers N bytes of `deterministic_bytes(N)` instead of the JSON description;
        `gzip=1` gzips the body and sets `Content-Encoding: gzip`; `chunked=1` streams it in 64 KiB writes
        without Content-Length; `status=N` picks the status. `X-Body-Sha256` is the sha256 of the bytes sent.
        """
        if is_upgrade(request):
            return await echo_socket(request, self._socket_closed)
        body = await request.read()
        query = request.query
        if "size" in query:
            payload, content_type = deterministic_bytes(int(query["size"])), "application/octet-stream"
        else:
            payload, content_type = json.dumps(_describe(request, body)).encode(), "application/json"
        headers: dict[str, str] = {}
        if query.get("gzip") == "1":
            payload = gzip.compress(payload, mtime=0)
            headers["Content-Encoding"] = "gzip"
        headers["X-Body-Sha256"] = hashlib.sha256(payload).hexdigest()
        status = int(query.get("status", "200"))
        if query.get("chunked") != "1":
            return web.Response(body=payload, status=status, headers=headers, content_type=content_type)
        response = web.StreamResponse(status=status, headers={**headers, "Content-Type": content_type})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(payload), 65_536):
            await response.write(payload[start : start + 65_536])
        await response.write_eof()
        return response


def _record(request: web.Request, body: bytes) -> RecordedRequest:
    try:
        parsed: Any | None = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        parsed = None
    return RecordedRequest(
        method=request.method,
        path=request.path,
        raw_path=request.rel_url.raw_path,
        query_string=request.query_string,
        query=MultiDictProxy(MultiDict(request.query)),
        headers=CIMultiDictProxy(CIMultiDict(request.headers)),
        body=body,
        json=parsed,
    )


def _describe(request: web.Request, body: bytes) -> dict[str, Any]:
    return {
        "method": request.method,
        "path": request.path,
        "raw_path": request.rel_url.raw_path,
        "query_string": request.query_string,
        "headers": [[name, value] for name, value in request.headers.items()],
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "body_length": len(body),
    }


def _drop_connection(request: web.Request) -> None:
    """Reset the client's connection mid-response (or before one), as a crashing upstream or LB would."""
    if request.transport is not None:
        request.transport.abort()


def _model_json(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": MODEL_CREATED, "owned_by": "system"}


def _encode_vector(vector: list[float], as_base64: bool) -> list[float] | str:
    if not as_base64:
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


# --------------------------------------------------------------------------------------------------------------------
# Running as a process
# --------------------------------------------------------------------------------------------------------------------


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.openai_upstream", description="Serve the fake OpenAI upstream until stopped."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    parser.add_argument("--context-window", type=int, default=DEFAULT_CONTEXT_WINDOW)
    parser.add_argument(
        "--model-window", action="append", default=[], metavar="MODEL=TOKENS", help="per-model window (repeatable)"
    )
    parser.add_argument(
        "--tool-loop",
        metavar="TOOL",
        help="answer with tool_loop_responder(TOOL, --steps), and responses_tool_loop_responder on /v1/responses",
    )
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--stream-chunk-delay", type=float, default=0.0, help="seconds between SSE chunks")
    parser.add_argument("--stream-digests", action="store_true", help="add X-Stream-Sha256 headers to streams")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    windows = {model: int(tokens) for model, tokens in (item.split("=", 1) for item in args.model_window)}
    responder = tool_loop_responder(args.tool_loop, args.steps, parallel=args.parallel) if args.tool_loop else None
    responses_responder = (
        responses_tool_loop_responder(args.tool_loop, args.steps, parallel=args.parallel) if args.tool_loop else None
    )
    upstream = OpenAIUpstream(
        responder,
        context_window=args.context_window,
        context_windows=windows,
        host=args.host,
        port=args.port,
        stream_chunk_delay=args.stream_chunk_delay,
        stream_digests=args.stream_digests,
        responses_responder=responses_responder,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with upstream:
        print(upstream.base_url, flush=True)
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> None:
    """Serve until SIGINT or SIGTERM, after printing the base URL on stdout."""
    asyncio.run(_serve(_parse_args(argv)))


if __name__ == "__main__":
    main()
