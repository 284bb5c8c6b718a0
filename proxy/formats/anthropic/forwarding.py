"""The body a compacted Messages request is forwarded with: the engine's messages mapped back, then the API's rules.

`forward` is the one step the pipeline calls with what the engine returned: it maps the messages back
(`MessagesRequest.mapped`), drops the thinking blocks a change before them invalidates and opts the continued turn
into `drop_block` (`rules.bind_thinking`, `rules.with_drop_block`), and marks the end of the compacted prefix, then
the end of the head the rewrite left as the client sent it, as cache breakpoints while the request has room for them
(`rules.with_breakpoint`, `rules.unchanged_head_end`). When the engine's messages map back to
the request itself, the client's bytes go as they came.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from proxy.engine.json_bytes import json_bytes
from proxy.engine.messages import Message
from proxy.formats.anthropic.rules import (
    DIGEST_BYTES,
    THINKING_BINDING_BETA,
    bind_thinking,
    binds_prefix,
    compacted_prefix_end,
    message_digest,
    unchanged_head_end,
    with_breakpoint,
    with_drop_block,
)
from proxy.pipeline.wire import Forwarding

if TYPE_CHECKING:
    from proxy.formats.anthropic.request import MessagesRequest


@dataclass(frozen=True)
class Forward:
    """What to send upstream.

    :param body: The body: the client's own bytes when nothing changed.
    :param beta: An `anthropic-beta` value the request must also send (`rules.with_beta`), or None.
    :param dropped_thinking: How many thinking blocks the proxy dropped.
    :param breakpoint: The message the proxy's cache breakpoint went on, or None.
    :param messages: The messages sent, when the body is not the client's.
    :param let_through: Thinking of the continued turn went with a changed prefix before it, for the API to drop
        (`rules.Bound.drop_block`): whatever the model thinks while it is there is bound to it.
    """

    body: bytes
    beta: str | None = None
    dropped_thinking: int = 0
    breakpoint: int | None = None
    messages: Sequence[Mapping[str, Any]] = ()
    let_through: bool = False


def forward(
    request: MessagesRequest,
    raw: bytes,
    engine: Sequence[Message],
    *,
    baseline: Sequence[Mapping[str, Any] | bytes] | None = None,
    tools_changed: bool = False,
    kept_drop_block: bool = False,
) -> Forward:
    """The body for the engine's `engine` messages (made from `request`, whose body is `raw`).

    :param baseline: What the thinking blocks were produced with (`rules.bind_thinking`): the previous forwarded
        messages (or their digests) plus what the client appended since; the client's own messages when None.
    :param tools_changed: Whether the forwarded `tools` differ from what the thinking was produced with (the read
        tool added or removed): a change before every message.
    :param kept_drop_block: Whether an earlier forward of this conversation opted into `drop_block`. The blocks it
        let through stay bound to a prefix that is gone, so every later request opts in too, as Anthropic's
        documentation prescribes ("send it on every request after that in the conversation").
    """
    mapped = request.mapped(engine)
    source = request.conversation.messages
    if not (tools_changed or kept_drop_block) and request.unchanged(mapped.system, mapped.messages):
        return Forward(raw)
    head_changed = tools_changed or mapped.system is not request.conversation.system
    bound = bind_thinking(
        mapped.messages, mapped.origins, source, request.model, baseline=baseline, head_changed=head_changed
    )
    fields = request.fields_with(mapped.system, bound.messages)
    beta = None
    thinking = fields.get("thinking")
    opts_in = bound.drop_block or kept_drop_block
    if opts_in and not (isinstance(thinking, Mapping) and thinking.get("type") == "disabled"):
        fields["thinking"] = with_drop_block(thinking)
        beta = THINKING_BINDING_BETA
    end = compacted_prefix_end(bound.messages, bound.origins, source)
    if end is not None:
        fields["messages"] = with_breakpoint(fields, end)
    head = unchanged_head_end(bound.messages, bound.origins, source)
    if head is not None and mapped.system is request.conversation.system:
        fields["messages"] = with_breakpoint(fields, head)
    return Forward(json_bytes(fields), beta, bound.dropped, end, fields["messages"], bound.drop_block)


@dataclass(frozen=True)
class SentBefore:
    """How a conversation's previous request was forwarded to a model that binds thinking (`Forwarding.replay_state`).

    :param sent: The `message_digest` of each message it sent, one after the other (`DIGEST_BYTES` each): one
        object, not one per message, so what it costs is what it holds.
    :param client_length: How many messages the client sent in it.
    """

    sent: bytes
    client_length: int

    def digests(self) -> list[bytes]:
        """The `message_digest` of each message sent, in order."""
        return [self.sent[start : start + DIGEST_BYTES] for start in range(0, len(self.sent), DIGEST_BYTES)]


def forwarding(request: MessagesRequest, raw: bytes, engine: Sequence[Message] | None, previous: Any) -> Forwarding:
    """What to send for `request` (see `MessagesRequest.forwarded`), and what its conversation's next request needs.

    :param engine: The engine's messages to send; None for the client's own.
    :param previous: What the conversation's previous request was forwarded as (a `SentBefore`), if known. Then the
        thinking produced since is kept where its prefix is unchanged, and the request opts into `drop_block`: a
        request of the conversation forwarded in between without the proxy's record (`X-Compaction: off`) cannot
        make the API refuse it. None after a request that let thinking through for the API to drop.
    """
    tools_changed = request.body.get("tools") is not request.conversation_tools
    before = previous if isinstance(previous, SentBefore) else None
    if engine is None and not tools_changed and before is None:
        return Forwarding(raw)
    source = request.conversation.messages
    baseline: list[Mapping[str, Any] | bytes] | None = None
    if before is not None:
        baseline = [*before.digests(), *source[before.client_length :]]
    sent = forward(
        request,
        raw,
        request.messages if engine is None else engine,
        baseline=baseline,
        tools_changed=tools_changed,
        kept_drop_block=before is not None,
    )
    headers = {"anthropic-beta": sent.beta} if sent.beta else {}
    if sent.body is raw or sent.let_through or not binds_prefix(request.model):
        # After thinking was let through for the API to drop, the next request starts afresh from the client's
        # messages: everything thought since is bound to the dropped blocks, and goes with them.
        return Forwarding(sent.body, headers)
    state = SentBefore(b"".join(message_digest(message) for message in sent.messages), len(source))
    return Forwarding(sent.body, headers, state, replay_bytes=len(state.sent))
