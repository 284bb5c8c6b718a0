"""The contract between the HTTP server and the pipeline that decides every compacted request.

The server owns sockets, headers and streaming; the compaction side owns parsing, state and the engine. They meet
here: the server hands over an `IncomingRequest` and gets back a `ForwardPlan` saying what to send upstream; when the
upstream has answered, the server reports the outcome with `UpstreamOutcome` so usage can anchor the next estimate.
A request the proxy will not forward at all (over its limits) gets a `Refusal` instead, which the server answers
in the request's wire format's error shape (`WireFormat.error_body`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from proxy.config.routes import DEFAULT_ROUTE
from proxy.pipeline.cache_misses import Misses

if TYPE_CHECKING:
    from proxy.pipeline.wire import WireFormat


@dataclass(frozen=True)
class IncomingRequest:
    """A request of a wire format the proxy compacts, as the client sent it.

    :param body: The raw request body, exactly as received.
    :param headers: The client's request headers (case-insensitive mapping).
    :param path: The request path, e.g. `/v1/chat/completions`, `/v1/responses` or an Azure deployment path.
    :param wire: The wire format, from the path (`proxy.formats.format_of`).
    :param route: The name of the route the server sends it on (`proxy.config.routes`): the upstream its calls of the
        proxy's own (summaries, probes, counts) go to, and what its per-upstream state is kept under.
    """

    body: bytes
    headers: Mapping[str, str]
    path: str
    wire: WireFormat
    route: str = DEFAULT_ROUTE


@dataclass
class ForwardPlan:
    """What the server forwards upstream for one request, and how it relays the answer.

    :param body: The body to send upstream: the client's own bytes when nothing was changed.
    :param response_headers: Headers to add to the response the client receives (what compaction did).
    :param stream: Whether the request asked for a streamed (SSE) response.
    :param strip_usage_chunk: The proxy asked the upstream for a usage chunk the client did not ask for, so the
        server must drop the usage-only final chunk from the stream it relays.
    :param context: Opaque state the compaction side needs back in `UpstreamOutcome`.
    :param reads: The proxy's read tool was added: how the server answers the model's calls to it (a
        `proxy.pipeline.offload.reads.ReadBack`), or None.
    :param failed_open: The compaction side failed and forwards the client's bytes unchanged: the stage that failed,
        for the server to count with its own fail-opens (`compaction_proxy_fail_open_total`); None when it did not.
    :param model: The model the request names, fit for a log line (the access line names it); None when unread.
    :param header_values: Values the server adds to list-valued upstream request headers, by name (see
        `proxy.pipeline.wire.Forwarding`): an opt-in the forwarded body needs that the client's headers lack.
    :param route: The route of the request it was made for (`IncomingRequest.route`): which route's pipeline the
        outcome is reported to.
    :param cache_misses: Set by `complete` once the answer's usage is known: its uncached prompt tokens by cause
        (see `proxy.pipeline.cache_misses`), for the access log and the trace. None when the request was not recorded.
    :param conversation: The conversation the request names (`proxy.pipeline.caller.conversation_of`, as sent), set
        on every plan `prepare` returns: read once per request, for the ledger and the server's record alike.
    """

    body: bytes
    response_headers: dict[str, str] = field(default_factory=dict)
    stream: bool = False
    strip_usage_chunk: bool = False
    context: Any = None
    reads: Any = None
    failed_open: str | None = None
    model: str | None = None
    header_values: dict[str, str] = field(default_factory=dict)
    route: str = DEFAULT_ROUTE
    cache_misses: Misses | None = None
    conversation: str | None = None


@dataclass(frozen=True)
class Refusal:
    """A request the proxy answers itself with an error in its format's shape instead of forwarding it.

    :param status: HTTP status (400 for a request over the proxy's limits).
    :param message: What is wrong and what to do; never quotes the request.
    :param code: The stable machine-readable code.
    :param param: The request field at fault.
    """

    status: int
    message: str
    code: str
    param: str | None = None


@dataclass(frozen=True)
class UpstreamOutcome:
    """What the upstream answered to a forwarded request.

    :param status: The upstream's HTTP status.
    :param usage: The `usage` object the upstream reported (final chunk when streaming), if any, with a chat
        completion's field names (a Responses API usage is renamed; see `proxy.formats.responses.answers`).
    :param reply: The assistant message of the first choice, reassembled from the deltas when streaming:
        `{"role": "assistant", "content": ..., "tool_calls": [...]}` (a response's output items as the engine sees
        them); None when there was none.
    :param error_body: The parsed JSON error body of a non-2xx answer, if it was JSON.
    :param response_id: The id of a Responses API answer, which a later request may continue from.
    """

    status: int
    usage: Mapping[str, Any] | None = None
    reply: Mapping[str, Any] | None = None
    error_body: Mapping[str, Any] | None = None
    response_id: str | None = None


class Compaction(Protocol):
    """Decides what the upstream receives for each compacted request and learns from what it answers."""

    async def prepare(self, incoming: IncomingRequest) -> ForwardPlan | Refusal:
        """Return what to forward for this request, or why it is refused.

        Must never raise: on any internal error, forward as received.
        """
        ...

    async def complete(self, plan: ForwardPlan, outcome: UpstreamOutcome) -> ForwardPlan | None:
        """Record the upstream's answer; return a plan to retry with (once) after a context overflow, else None."""
        ...


class PassThrough:
    """A `Compaction` that changes nothing: forwards every request as received and learns nothing."""

    async def prepare(self, incoming: IncomingRequest) -> ForwardPlan:
        """Forward the client's bytes unchanged."""
        return ForwardPlan(body=incoming.body)

    async def complete(self, plan: ForwardPlan, outcome: UpstreamOutcome) -> ForwardPlan | None:
        """Never retry."""
        return None
