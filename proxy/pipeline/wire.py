"""The one interface a wire format implements, so the pipeline and the server decide every request alike.

The pipeline works on the engine's messages and never on a format's JSON; the server moves bytes and never reads
them. Everything in between that depends on the format (how a request is parsed and written back, how an answer
reports its usage and reply, what a refusal inside a stream looks like, the proxy's read tool and its rounds) is
asked of the request's `WireFormat`, one object per format (`proxy.formats`). A new format is a folder that
implements this protocol and one entry in `proxy.formats.FORMATS`; nothing here or in the server changes. What
only some formats can do is an optional capability they declare (`socket` here, the others in
`proxy.pipeline.capabilities`).

Rules every implementation keeps:

- Nothing it is given is mutated unless the method says so (`without_reads`, `hide_read`, `sum_usage`), and nothing
  an upstream sends makes it raise: an event or answer of an unexpected shape is "not this", never an error.
- Usage is reported in chat-completion terms (`prompt_tokens`, `completion_tokens`, ...), whatever the format calls
  it, so anchoring and calibration are the same for every format.
- Decisions on a stream are made from one parsed event at a time, in order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.config import Settings
from proxy.engine.messages import Message
from proxy.engine.provider_edits import ProviderEdits
from proxy.pipeline.capabilities import ByteSplicing, ExactCounting, PromptCounting, ProviderHistory
from proxy.pipeline.exchange import Refusal, UpstreamOutcome
from proxy.pipeline.requests import RequestLimits


def bearer_credential(key: str) -> dict[str, str]:
    """`Authorization: Bearer <key>`: how OpenAI's APIs (and those compatible with them) take a key."""
    return {"Authorization": f"Bearer {key}"}


class WireRequest(Protocol):
    """A request of one wire format, parsed: what the pipeline reads of it."""

    @property
    def body(self) -> Mapping[str, Any]:
        """The whole parsed body; never modified."""
        ...

    @property
    def messages(self) -> list[Message]:
        """The conversation as the engine's messages."""
        ...

    @property
    def model(self) -> str | None:
        """The requested model, if the body names one."""
        ...

    @property
    def stream(self) -> bool:
        """Whether a streamed (SSE) answer was asked for."""
        ...

    @property
    def reserved_tokens(self) -> int:
        """The tokens the request reserves for its reply (0 when it reserves none)."""
        ...

    @property
    def overhead_fields(self) -> Mapping[str, Any]:
        """The fields the engine counts besides the messages (tools), in chat-completion shape."""
        ...

    @property
    def last_message(self) -> Message | None:
        """The conversation's last message as the engine's message (its role and content), None when it has none.

        What a client's own compaction request is told by (`proxy.pipeline.client_compaction`), without mapping the
        whole conversation where a format maps it.
        """
        ...

    @property
    def text_only(self) -> bool:
        """Whether its messages are text whose bytes bound their tokens (`proxy.pipeline.requests.text_only`).

        No image, audio, file, thinking or other block the engine counts otherwise: what lets a small body be sized
        by its bytes (`proxy.pipeline.byte_bound`).
        """
        ...

    @property
    def added_prompt_tokens(self) -> int:
        """Tokens the provider adds to the prompt that no field shows (Anthropic's tool-use system prompt); often 0."""
        ...

    @property
    def provider_edits(self) -> ProviderEdits | None:
        """The edits the request asks its provider to make on its side (`proxy.engine.provider_edits`), or None."""
        ...

    @property
    def compaction_signal(self) -> str | None:
        """What in the body says its client compacts itself (`compaction-items`, `context-management`), or None."""
        ...

    def forwarded(self, raw: bytes, messages: list[Message] | None, previous: Any = None) -> Forwarding:
        """What to send: `raw` (the client's bytes) when `messages` is None, else the request with them.

        :param previous: The `Forwarding.replay_state` of the conversation's previous request, when the pipeline has it.
        """
        ...


@dataclass(frozen=True)
class Forwarding:
    """A forwarded request: its body, and what its headers must say besides the client's.

    :param body: The body to send.
    :param header_values: Values to add to list-valued request headers (comma-separated lists, RFC 9110 5.3), by
        header name: an opt-in the rewritten body needs (Anthropic's `anthropic-beta` for a body field in beta).
    :param replay_state: What the format needs to forward the conversation's next request (`WireRequest.forwarded`'s
        `previous`; Anthropic: what each thinking block sent back was bound to); None when nothing.
    :param replay_bytes: What `replay_state` holds, in bytes: what keeping it costs (`forwarded_memory_bytes`).
    """

    body: bytes
    header_values: Mapping[str, str] = field(default_factory=dict)
    replay_state: Any = None
    replay_bytes: int = 0


@dataclass(frozen=True)
class Overflow:
    """A context overflow an upstream reported in its own error shape, with the window it stated (None: none)."""

    window: int | None


@dataclass(frozen=True)
class Reads:
    """What the model asked the proxy to read in one answer, and what goes back into the conversation with it.

    :param calls: `(call id, reference)` of each read call kept; the reference is None when the arguments name none.
    :param appended: What the format appends before the results (chat messages, Responses items): the model's output
        with only the kept read calls.
    :param left_out: Read calls left out: repeats of a reference within the answer, and calls past the limit.
    """

    calls: list[tuple[str, str | None]]
    appended: list[dict[str, Any]] = field(default_factory=list)
    left_out: int = 0


@dataclass
class StreamReport:
    """What a stream reported so far, folded event by event (`WireFormat.read_event`).

    :param usage: The usage, in chat-completion terms.
    :param native_usage: The same usage as the format names it.
    :param reply: The assistant's reply so far (`reply_of` builds it), in the format's own terms.
    :param response_id: The id of the answer, when a later request may continue from it.
    :param final: The answer as the format's final event carried it whole, if it carries one.
    :param skim: What the format keeps to read the stream's events from their bytes (`WireFormat.skim_event`).
    """

    usage: dict[str, Any] | None = None
    native_usage: Mapping[str, Any] | None = None
    reply: Any = None
    response_id: str | None = None
    final: Mapping[str, Any] | None = None
    skim: Any = None


class SocketMode(Protocol):
    """A format's requests as messages on a WebSocket, answered by the events of a stream, one message each."""

    def request_of(self, message: bytes) -> tuple[str | None, bytes] | None:
        """A message that starts a request: its lane (answers come in order per lane) and the request's body."""
        ...

    def message_of(self, body: bytes) -> bytes:
        """The message that starts the request `body` (the body the pipeline decided to send)."""
        ...

    def refusal_message(self, refusal: Refusal) -> bytes:
        """The message answering a request the proxy will not forward."""
        ...

    def ending(self, message: bytes) -> tuple[str | None, UpstreamOutcome] | None:
        """The lane and outcome (usage, reply, error) of a message that ends an answer, else None."""
        ...


class WireFormat(Protocol):
    """One wire format the proxy compacts: its requests, answers, streams and read rounds (module docstring).

    :ivar name: The format's label in metrics, logs and state scopes (`chat_completions`, `responses`).
    :ivar entries: The request field holding the conversation, as a refusal names it (`messages`, `input`).
    :ivar scope: What keeps this format's state apart from another's under one tenant (None: the tenant's own).
    :ivar read_tool: The proxy's read tool as this format declares a tool.
    :ivar conversation_headers: Request headers this format's clients name a conversation with, tried after the
        configured `conversation_header` (Claude Code's `x-claude-code-session-id`); lower case.
    :ivar call_headers: Request headers a call the proxy makes itself (a summary) copies from the client's request
        besides its credential: what the API requires of every request (`anthropic-version`, `anthropic-beta`).
    """

    name: str
    entries: str
    scope: str | None
    read_tool: Mapping[str, Any]
    conversation_headers: tuple[str, ...]
    call_headers: tuple[str, ...]
    api: str
    """The API it is part of (`openai`, `anthropic`): the built-in route its requests, and its API's other endpoints'
    (by `api_headers`), take by default (`proxy.config.routes`)."""
    api_headers: tuple[str, ...]
    """Request headers only this format's API is called with (`anthropic-version`), lower case: a request it does not
    compact (another endpoint of the API, passed through) still gets the proxy's own errors in its shape."""
    sized_by_bytes: bool
    """Whether a small body's bytes bound its tokens (`proxy.pipeline.byte_bound`): plain JSON messages, no items."""
    socket: SocketMode | None
    """How its requests come as messages on a WebSocket to its path (the Responses API's WebSocket mode), or None."""
    splicing: ByteSplicing | None
    """How a conversation's next request is recognized from its bytes and spliced (chat completions), or None."""
    provider_history: ProviderHistory | None
    """How its requests continue a history the provider keeps (the Responses API's `previous_response_id`), or None."""
    exact_counting: ExactCounting | None
    """Where the upstream's exact count of its prompts comes from, or None (measured with the local count only)."""
    prompt_counting: PromptCounting | None
    """Its API's endpoint counting a prompt, whose requests are sent as the matching request is forwarded, or None."""

    def serves(self, path: str) -> bool:
        """Whether a POST to `path` is a request of this format that compaction sees."""
        ...

    def recognizes(self, body: Mapping[str, Any]) -> bool:
        """Whether a request body with no path to tell (a file on the command line) is of this format."""
        ...

    def parse(self, raw: bytes, limits: RequestLimits | None) -> WireRequest:
        """The request parsed and checked against the proxy's limits.

        :raises InvalidRequest: Not a request compaction can work on (forwarded untouched).
        :raises RequestOverLimit: Over the proxy's limits (refused).
        """
        ...

    def model(self, request: Any, path: str) -> str | None:
        """The model a request is for: the one its body names, or one its path names."""
        ...

    def window(self, model: str | None, headers: Mapping[str, str]) -> int | None:
        """The window this format knows for `model` under these request headers (lower-cased names), or None.

        Asked before the shipped table (a window some header opts into, such as Anthropic's 1M-token beta).
        """
        ...

    def overflow(self, status: int, error_body: Mapping[str, Any] | None) -> Overflow | None:
        """The context overflow an error answer (or an in-stream refusal's body) reports, read from its shape only."""
        ...

    def error_body(self, message: str, kind: str, code: str, param: str | None) -> bytes:
        """The JSON body of an error the proxy answers itself in this format's shape (what its SDKs surface).

        :param kind: The error family (`invalid_request_error`, ...).
        :param code: A stable machine-readable code.
        :param param: The request field at fault, if one is.
        """
        ...

    def asks_usage(self, request: Any) -> bool:
        """Whether a streamed answer to `request` must be asked for its usage, which it would not report otherwise.

        The proxy then asks for it, and strips from the relayed stream what the client did not ask for.
        """
        ...

    def answer(self, answer: Mapping[str, Any]) -> tuple[dict[str, Any] | None, Message | None, str | None]:
        """A whole 2xx answer's usage (chat terms), its reply as the engine's assistant message, and its id."""
        ...

    def read_event(self, event: Mapping[str, Any], report: StreamReport) -> None:
        """Fold one stream event into what the stream reported."""
        ...

    def skim_event(self, data: bytes, report: StreamReport) -> bool:
        """Fold in an event from its bytes (its `data`) when it needs no parse: as `read_event` would; else False.

        For the common events only, a text delta or one `read_event` ignores (`proxy.formats.event_bytes`); never
        for an event with a top-level `usage` member.
        """
        ...

    def reply_of(self, report: StreamReport) -> Message | None:
        """The assistant message a stream's reply amounts to."""
        ...

    def opening(self, event: Mapping[str, Any]) -> bool:
        """Whether a stream event is one a stream opens with before it refuses or answers (it decides nothing)."""
        ...

    def refusal(self, event: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The error body (`{"error": {...}}`) of an event refusing the request inside a stream, else None."""
        ...

    def error_event(self, error: Mapping[str, Any]) -> bytes:
        """An event carrying `error` in this format's stream, for a failure after the client's stream opened."""
        ...

    def decides_reads(self, event: Mapping[str, Any]) -> bool | None:
        """Whether a stream is a read round (True), for the client (False), or undecided (None) after this event."""
        ...

    def reads(self, answer: Mapping[str, Any], limit: int) -> Reads | None:
        """The reads a whole answer asks for (at most `limit` distinct), when its first call is the read tool."""
        ...

    def stream_reads(self, report: StreamReport, limit: int) -> Reads | None:
        """The reads a read round's stream asked for, from what it reported."""
        ...

    def without_reads(self, answer: dict[str, Any]) -> bool:
        """Take the read calls (and an echoed read tool) out of a whole answer; whether there were any."""
        ...

    def hide_read(self, event: dict[str, Any], hidden: set[Any]) -> bool | None:
        """Take read calls out of a relayed stream event: None drops the event, True says it was edited.

        :param hidden: The read calls seen so far in this stream (by the format's own keys); added to.
        """
        ...

    def usage_holder(self, event: Mapping[str, Any]) -> dict[str, Any] | None:
        """The object of a stream event or whole answer that holds its usage (in the format's terms), if any."""
        ...

    def asked_again(self, fields: dict[str, Any], reads: Reads, results: Sequence[str]) -> None:
        """Append the model's read calls and their results to a forwarded request's fields (edits `fields`)."""
        ...

    def call_credential(self, key: str) -> Mapping[str, str]:
        """The headers a call the proxy makes itself (a summary) sends the operator's key (`summary_api_key`) in.

        As the format's API takes a key: OpenAI's `Authorization: Bearer`, Anthropic's `x-api-key`. Without the
        operator's key a call carries the caller's own credential headers.
        """
        ...

    def answer_without_tools(self, fields: dict[str, Any]) -> None:
        """Make a request's fields ask for an answer in text, its tools still declared (edits `fields`)."""
        ...

    def summary_call(
        self, request: Any, messages: Sequence[Message], indices: Sequence[int], *, sections: str, settings: Settings
    ) -> bytes:
        """The body of a summary call: `request` as `messages` are forwarded, then one instruction for `indices`.

        Every byte before the instruction is what the forwarded request holds there, so the provider's prompt cache
        serves it; the call asks for text (tools declared, none called) and is not streamed.
        """
        ...

    def summary_text(self, answer: Any) -> str | None:
        """The summary a summary call's answer holds (None when it holds none).

        :raises KeyError, IndexError, TypeError: The answer is not of this format (counted as malformed).
        """
        ...

    def usage_in_chat_terms(self, usage: Mapping[str, Any]) -> dict[str, Any]:
        """A usage object of this format with a chat completion's field names."""
        ...
