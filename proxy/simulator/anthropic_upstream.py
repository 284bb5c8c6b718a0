"""A fake Anthropic Messages API on loopback, as strict as the real one on what the proxy could get wrong.

`POST /v1/messages` checks a request by the rules in `proxy.simulator.anthropic_rules` (with the API's error bodies),
counts its tokens, refuses a prompt over the model's window with the API's overflow texts, and answers from the
responder: as one JSON message, or streamed as the API streams (`message_start`, then for each block
`content_block_start`, its deltas and `content_block_stop`, a `ping`, `message_delta` with the cumulative usage,
`message_stop`). Every thinking block it emits is signed (`Signer`): over its text, and on a binding model over
everything before it, so a block sent back after its prefix changed fails as it does at Anthropic.

Prompt caching follows the API's prefix rule: a request's `cache_control` breakpoints write the prefix ending at
each of them; a later request reads the longest written prefix ending at one of its own breakpoints or at most
`LOOKBACK_BLOCKS` blocks before one (`cache_read_input_tokens`), and writes the rest up to its last breakpoint
(`cache_creation_input_tokens`); `input_tokens` is what follows. Prefixes under `MIN_CACHE_TOKENS` are not cached.

`POST /v1/messages/count_tokens` answers `{"input_tokens": N}` for what a create request would count, after the same
checks (shape, breakpoints, tool pairing, thinking signatures and, on a binding model, their prefixes): a request
creating would refuse, counting refuses with the same 400.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proxy.simulator.anthropic_rules import (
    AnthropicError,
    Segment,
    Signer,
    binds,
    block_tokens,
    blocks_of,
    check_breakpoints,
    check_pairing,
    check_shape,
    check_thinking,
    check_window,
    prefix_bytes,
    prompt_segments,
)
from proxy.simulator.loopback_server import LoopbackServer

LOOKBACK_BLOCKS = 20
MIN_CACHE_TOKENS = 1024
CACHE_LIFETIME = 5 * 60.0
"""Seconds a written prefix lives unless read again (the API's default `ttl`, 5 minutes; each read refreshes it)."""

Responder = Callable[[Mapping[str, Any]], list[dict[str, Any]]]
"""Maps a valid request body to the reply's content blocks (thinking blocks unsigned: the upstream signs them)."""


def thinks(body: Mapping[str, Any]) -> bool:
    """Whether the request turns thinking on."""
    thinking = body.get("thinking")
    return isinstance(thinking, Mapping) and thinking.get("type") in ("enabled", "adaptive")


def tool_loop_responder(
    tool: str | None = "search",
    steps: int = 1,
    words: int = 20,
    arguments: Callable[[int, int], Mapping[str, Any]] | None = None,
) -> Responder:
    """A model that thinks when asked to, calls `tool` `steps` times per user turn, then answers in text.

    A call's input is `arguments(turn, step)`, `{"q": turn}` by default.
    """

    def respond(body: Mapping[str, Any]) -> list[dict[str, Any]]:
        messages = body["messages"]
        turn = sum(1 for m in messages if m.get("role") == "user" and not _results_only(m))
        done = 0
        for message in reversed(messages):
            if message.get("role") == "user" and not _results_only(message):
                break
            done += message.get("role") == "assistant"
        blocks: list[dict[str, Any]] = [{"type": "thinking", "thinking": f"Turn {turn}, step {done}."}]
        blocks = blocks if thinks(body) else []
        if tool is not None and body.get("tools") and done < steps:
            given = dict(arguments(turn, done)) if arguments else {"q": turn}
            call = {"type": "tool_use", "id": f"toolu_{secrets.token_hex(8)}", "name": tool, "input": given}
            return [*blocks, call]
        return [*blocks, {"type": "text", "text": f"Answer {turn}: " + "word " * words}]

    return respond


def _results_only(message: Mapping[str, Any]) -> bool:
    blocks = blocks_of(message)
    return bool(blocks) and all(block.get("type") == "tool_result" for block in blocks)


@dataclass
class PromptCache:
    """Written prefixes, by model, as chained digests (see the module docstring), each with when it was last used.

    A prefix unused for longer than `lifetime` seconds of `clock` is gone; a test passes a fake clock (shared with the
    proxy's ledger) and advances it instead of waiting. One lifetime for every breakpoint (`"ttl": "1h"` is not told
    apart).
    """

    written: dict[bytes, float] = field(default_factory=dict)
    lifetime: float | None = CACHE_LIFETIME
    clock: Callable[[], float] = time.monotonic

    def _live(self, digest: bytes, now: float) -> bool:
        used = self.written.get(digest)
        return used is not None and (self.lifetime is None or now - used <= self.lifetime)

    def usage(self, model: str, segments: Sequence[Segment]) -> dict[str, int]:
        """The usage of a prompt of `segments`: tokens read from the cache, written to it, and the rest."""
        digest, digests, totals, running = model.encode(), [], [], 0
        for segment in segments:
            digest = hashlib.sha256(digest + segment.data).digest()
            running += segment.tokens
            digests.append(digest)
            totals.append(running)
        marks = [index for index, segment in enumerate(segments) if segment.breakpoint]
        read, now = 0, self.clock()
        for mark in marks:
            for position in range(mark, max(-1, mark - LOOKBACK_BLOCKS), -1):
                if self._live(digests[position], now):
                    self.written[digests[position]] = now
                    read = max(read, totals[position])
                    break
        written = 0
        for mark in marks:
            if totals[mark] >= MIN_CACHE_TOKENS:
                self.written[digests[mark]] = now
                written = max(written, totals[mark])
        created = max(0, written - read)
        return {
            "input_tokens": running - read - created,
            "cache_creation_input_tokens": created,
            "cache_read_input_tokens": read,
        }


class AnthropicUpstream(LoopbackServer):
    """The fake Messages API server (see the module docstring).

    :param context_window: The window of any model not in `context_windows`.
    :param context_windows: Windows by model-name prefix (the longest matching wins).
    :param responder: What the model answers; `tool_loop_responder()` if None. Reassignable.
    :param api_keys: When set, the keys it accepts in `x-api-key`: a request with another key, none, or a key sent as
        `Authorization: Bearer` (not in `auth_tokens`) gets the API's 401 `authentication_error`.
    :param auth_tokens: The tokens it accepts as `Authorization: Bearer` (OAuth tokens), when `api_keys` is set.
    :ivar stream_error: When set, a valid streamed request is answered with `message_start` and `ping`, then this
        error in an `error` event, as the API reports a failure after the stream began (`overloaded_error`).
    """

    def __init__(
        self,
        *,
        context_window: int = 200_000,
        context_windows: Mapping[str, int] | None = None,
        responder: Responder | None = None,
        api_keys: frozenset[str] | None = None,
        auth_tokens: frozenset[str] = frozenset(),
    ) -> None:
        self.api_keys = api_keys
        self.auth_tokens = auth_tokens
        self.count_requests: list[tuple[dict[str, Any], dict[str, str]]] = []
        """Each `count_tokens` request's body and headers."""
        self.count_refusals = 0
        """How many of the next `count_tokens` requests the rate limit refuses (429, `retry-after: 30`)."""
        self.context_window = context_window
        self.context_windows = dict(context_windows or {})
        self.responder = responder or tool_loop_responder()
        self.signer = Signer(secrets.token_bytes(32))
        self.cache = PromptCache()
        self.requests: list[dict[str, Any]] = []
        self.bodies: list[bytes] = []
        """Each create request's body, byte for byte (`requests` holds them parsed)."""
        self.headers: list[dict[str, str]] = []
        self.targets: list[str] = []
        """Each create request's path and query."""
        self.rejections: list[dict[str, Any]] = []
        self.refused: list[int] = []
        """The position in `requests` of each create request refused (in `rejections`)."""
        self.usages: list[dict[str, int]] = []
        """The usage of each message answered."""
        self.dropped_thinking = 0
        self.stream_error: dict[str, Any] | None = None
        self._ids = itertools.count(1)

    def make_app(self) -> web.Application:
        """An application serving the Messages API alone."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        self.add_routes(app)
        return app

    def add_routes(self, app: web.Application) -> None:
        """The Messages API's two routes, on `app` (alone, or beside the OpenAI routes of `Simulator`)."""
        app.router.add_post("/v1/messages", self._create)
        app.router.add_post("/v1/messages/count_tokens", self._count)

    def window(self, model: str) -> int:
        """The context window of `model`."""
        matches = [prefix for prefix in self.context_windows if model.startswith(prefix)]
        return self.context_windows[max(matches, key=len)] if matches else self.context_window

    def answer(self, body: dict[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
        """The message a valid request gets, or `AnthropicError` for one the API would refuse."""
        check_shape(body, headers)
        check_breakpoints(body)
        check_pairing(body["messages"])
        checked = check_thinking(body, self.signer)
        segments = prompt_segments(body, checked.messages)
        check_window(body, sum(segment.tokens for segment in segments), self.window(str(body["model"])))
        self.dropped_thinking += checked.dropped
        usage = self.cache.usage(str(body["model"]), segments)
        content = self._signed(body, self.responder(body))
        usage["output_tokens"] = sum(block_tokens(block) for block in content)
        self.usages.append(usage)
        stop = "tool_use" if any(block["type"] == "tool_use" for block in content) else "end_turn"
        return {
            "id": f"msg_{next(self._ids):08d}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }

    def authenticate(self, headers: Mapping[str, str]) -> None:
        """Refuse a request as the API does when it carries no credential it accepts (only when `api_keys` is set)."""
        if self.api_keys is None:
            return
        key, authorization = headers.get("x-api-key"), headers.get("authorization", "")
        if key is None and authorization.removeprefix("Bearer ") in self.auth_tokens:
            return
        if key is None and not authorization:
            raise AnthropicError("x-api-key header is required", status=401, kind="authentication_error")
        if key not in self.api_keys:
            raise AnthropicError("invalid x-api-key", status=401, kind="authentication_error")

    def _signed(self, body: Mapping[str, Any], content: list[dict[str, Any]]) -> list[dict[str, Any]]:
        signed: list[dict[str, Any]] = []
        for block in content:
            if block.get("type") != "thinking":
                signed.append(block)
                continue
            prefix = prefix_bytes(body, body["messages"], signed) if binds(str(body["model"])) else None
            signed.append({**block, "signature": self.signer.sign(block["thinking"], prefix)})
        return signed

    async def _create(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw)
        self.requests.append(body)
        self.bodies.append(raw)
        self.targets.append(request.path_qs)
        self.headers.append({key.lower(): value for key, value in request.headers.items()})
        try:
            self.authenticate(self.headers[-1])
            message = self.answer(body, self.headers[-1])
        except AnthropicError as error:
            self.rejections.append(error.body)
            self.refused.append(len(self.requests) - 1)
            return web.json_response(error.body, status=error.status)
        if body.get("stream") is not True:
            return web.json_response(message)
        return await self._stream(request, message)

    async def _count(self, request: web.Request) -> web.Response:
        body = await request.json()
        headers = {key.lower(): value for key, value in request.headers.items()}
        self.count_requests.append((body, headers))
        if self.count_refusals > 0:
            self.count_refusals -= 1
            limited = AnthropicError(
                "Number of request tokens has exceeded your rate limit.", status=429, kind="rate_limit_error"
            )
            return web.json_response(limited.body, status=429, headers={"retry-after": "30"})
        try:
            self.authenticate(headers)
            # The same checks as creating a message (the window aside): the API documents that counting runs the
            # thinking blocks' prefix check too, and refuses what creating would refuse with the same 400.
            check_shape({"max_tokens": 1, **body}, headers)
            check_breakpoints(body)
            check_pairing(body["messages"])
            checked = check_thinking(body, self.signer)
        except AnthropicError as error:
            return web.json_response(error.body, status=error.status)
        segments = prompt_segments(body, checked.messages)
        return web.json_response({"input_tokens": sum(segment.tokens for segment in segments)})

    async def _stream(self, request: web.Request, message: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        events = stream_events(message)
        if self.stream_error is not None:
            events = [*events[:1], ("ping", {"type": "ping"}), ("error", {"type": "error", "error": self.stream_error})]
        for name, data in events:
            await response.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        await response.write_eof()
        return response


def stream_events(message: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The events the API streams a message as."""
    usage = dict(message["usage"])
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message["content"]):
        events.extend(_block_events(index, block))
        if index == 0:
            events.append(("ping", {"type": "ping"}))
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    events.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _block_events(index: int, block: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    kind = block["type"]
    empty: dict[str, dict[str, Any]] = {
        "text": {"text": ""},
        "thinking": {"thinking": "", "signature": ""},
        "tool_use": {"input": {}},
    }
    opening: dict[str, Any] = {key: value for key, value in block.items() if key in ("type", "id", "name")}
    opening.update(empty[kind])
    deltas: list[dict[str, Any]] = []
    if kind == "text":
        text = block["text"]
        deltas = [{"type": "text_delta", "text": text[i : i + 20]} for i in range(0, len(text), 20)]
    elif kind == "thinking":
        deltas = [{"type": "thinking_delta", "thinking": block["thinking"]}]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    elif kind == "tool_use":
        arguments = json.dumps(block["input"])
        deltas = [
            {"type": "input_json_delta", "partial_json": arguments[i : i + 5]} for i in range(0, len(arguments), 5)
        ]
    events = [("content_block_start", {"type": "content_block_start", "index": index, "content_block": opening})]
    events.extend(("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}) for d in deltas)
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events
