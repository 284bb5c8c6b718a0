"""The simulated OpenAI upstream on loopback: chat completions and the Responses API, as OpenAI answers them.

`OpenAIUpstream` is a real aiohttp server on 127.0.0.1 that answers like OpenAI's API: it validates requests with
OpenAI's error bodies (including the tool-call pairing rules and `context_length_exceeded`,
`proxy.simulator.chat_rules`), counts prompt tokens itself with tiktoken (`proxy.simulator.openai_tokens`),
simulates prompt caching, streams Server-Sent Events the way OpenAI does (`proxy.simulator.chat_completion`), and
records every request it receives so tests can assert exactly what the proxy forwarded (`proxy.simulator.failures`
also scripts failures). The Responses API is `proxy.simulator.responses_server`'s.

Use it in-process::

    async with OpenAIUpstream(context_window=8192, responder=tool_loop_responder("search", steps=3)) as upstream:
        client = AsyncOpenAI(base_url=upstream.base_url + "/v1", api_key="sk-test")
        ...
        assert upstream.requests[-1].json["messages"] == ...

or run it alone with `compaction-proxy simulate` (`proxy.simulator.serving`).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from proxy.simulator.chat_completion import (
    SSE_DONE,
    Completion,
    completion_usage,
    sse_body,
    sse_event,
    stream_chunks,
    truncate_reply,
)
from proxy.simulator.chat_replies import (
    Reply,
    Responder,
    ToolCall,
    default_responder,
    fixed_responder,
    tool_loop_responder,
)
from proxy.simulator.chat_rules import context_length_error, validate_chat_request
from proxy.simulator.failures import Failure, RecordedRequest
from proxy.simulator.openai_common import (
    OpenAIError,
    json_response,
    parse_json_body,
    split_into_token_pieces,
    tool_call_id,
)
from proxy.simulator.openai_tokens import (
    PromptCache,
    count_completion_tokens,
    encoding_name_for_model,
    prompt_token_sequence,
)
from proxy.simulator.responses_api import ResponsesResponder, response_object
from proxy.simulator.responses_server import ResponsesService
from proxy.simulator.responses_socket import is_upgrade, recorded_fields, responses_socket
from proxy.simulator.responses_stream import error_events, response_events, sse_frame
from proxy.simulator.scripted import ScriptedServer
from proxy.simulator.side_routes import deterministic_bytes, echo, embedding_vector, embeddings, models_response

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


class OpenAIUpstream(ScriptedServer):
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
    served by `responses_service` (see `proxy.simulator.responses_server` for its rules); `responses_requests` lists its
    parsed create bodies and `responses_usages` the usage of each response or compaction it answered. `fail_next`
    and `misreport_usage_next` apply to it too.

    `host`, `port`, `delay_first_byte`, `stream_chunk_delay` and `cut_stream_after` are `ScriptedServer`'s, which
    records every request and scripts failures. `socket_closes` lists the close code of every echo WebSocket once it
    closed, and `socket_closed` is set then.
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
        super().__init__(
            host=host,
            port=port,
            delay_first_byte=delay_first_byte,
            stream_chunk_delay=stream_chunk_delay,
            cut_stream_after=cut_stream_after,
        )
        self.stream_tokens_per_chunk = stream_tokens_per_chunk
        self.stream_digests = stream_digests
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
        self._ids = itertools.count(1)

    # ---- knobs and observations ------------------------------------------------------------------------------------

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

    def add_routes(self, app: web.Application) -> None:
        """OpenAI's routes, then a 404 in OpenAI's words for any other path (so add others first)."""
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_post("/openai/deployments/{deployment}/chat/completions", self._chat_completions)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/responses", self._responses_socket)
        app.router.add_post("/v1/responses/compact", self._responses_compact)
        app.router.add_post("/v1/responses/input_tokens", self._responses_input_tokens)
        app.router.add_post("/v1/conversations", self._create_conversation)
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_get("/v1/models/{model}", self._get_model)
        app.router.add_post("/v1/embeddings", embeddings)
        # The ChatGPT backend Codex CLI talks to with a ChatGPT login: the Responses API (and its WebSocket mode) there.
        app.router.add_post("/backend-api/codex/responses", self._responses)
        app.router.add_get("/backend-api/codex/responses", self._responses_socket)
        app.router.add_post("/backend-api/codex/responses/compact", self._responses_compact)
        app.router.add_post("/openai/deployments/{deployment}/embeddings", embeddings)
        app.router.add_route("*", "/echo/{tail:.*}", self._echo)
        app.router.add_route("*", "/{tail:.*}", self._unknown_route)

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
                return await self._send_events(request, [sse_event(error.body)], b"", {})
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
    ) -> Completion:
        reply, finish_reason = truncate_reply(self.responder(body), limit or None, encoding_name)
        calls = [(call.name, call.arguments) for call in reply.tool_calls]
        completion_tokens = count_completion_tokens(reply.content, calls, encoding_name)
        serial = next(self._ids)
        misreport = self._misreports.popleft() if self._misreports else {}
        return Completion(
            id=f"chatcmpl-{hashlib.sha256(f'completion:{serial}'.encode()).hexdigest()[:29]}",
            created=int(time.time()),
            model=model,
            reply=reply,
            finish_reason=finish_reason,
            usage={**completion_usage(prompt_tokens, completion_tokens, cached), **misreport},
        )

    async def _stream(
        self, request: web.Request, completion: Completion, include_usage: bool, encoding_name: str
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
            digests["X-Stream-Sha256"] = hashlib.sha256(sse_body(chunks)).hexdigest()
            digests["X-Stream-Sha256-Without-Usage"] = hashlib.sha256(sse_body(plain)).hexdigest()
        return await self._send_events(request, [sse_event(chunk) for chunk in chunks], SSE_DONE, digests)

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
        """The Responses API's WebSocket mode (`proxy.simulator.responses_socket`)."""
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

    # ---- beside the model ------------------------------------------------------------------------------------------

    async def _list_models(self, request: web.Request) -> web.Response:
        return models_response(self.models)

    async def _get_model(self, request: web.Request) -> web.Response:
        return models_response(self.models, request.match_info["model"])

    async def _echo(self, request: web.Request) -> web.StreamResponse:
        return await echo(request, self._socket_closed)
