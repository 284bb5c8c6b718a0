"""What goes upstream for a decided request: the body, the read tool when it holds offloaded results, the headers.

Every decision ends here, the first request's and the overflow retry's alike: the messages to send (the client's own
bytes when nothing changed), the offloaded results they hold (the read tool is offered with them), and a stream asked
for its usage where its format needs asking. The plan carries what the server needs to relay the answer and what
`complete` needs to learn from it.
"""

from __future__ import annotations

from typing import Any

from proxy.config import Mode
from proxy.engine.messages import Message, chain_keys, message_key
from proxy.names import shown
from proxy.pipeline.exchange import ForwardPlan
from proxy.pipeline.offload.offloading import Offloading
from proxy.pipeline.prepared import Prepared
from proxy.pipeline.previous_forwards import PreviousForwards
from proxy.pipeline.request_work import RequestWork
from proxy.pipeline.wire import Forwarding


class Outgoing:
    """Builds the `ForwardPlan` of a decided request.

    :param mode: Observe mode never asks a stream for its usage (it changes nothing the client sends).
    :param offloading: Offers the read tool to a request holding offloaded results.
    :param work: Runs the serialization off the event loop when it is large.
    :param previous_forwards: What each conversation's latest request was forwarded as, for a format that builds on
        it (the Messages API binds thinking to what came before it).
    """

    def __init__(
        self, mode: Mode, offloading: Offloading, work: RequestWork, previous_forwards: PreviousForwards
    ) -> None:
        self.mode = mode
        self.offloading = offloading
        self.work = work
        self.previous_forwards = previous_forwards

    async def plan(
        self,
        raw: bytes,
        exchange: Prepared,
        messages: list[Message] | None,
        chain: list[bytes] | None,
        held: tuple[str, ...] = (),
        *,
        kept: bool = False,
        tokens: int | None = None,
    ) -> ForwardPlan:
        """The plan sending `messages` (the original bytes when None).

        :param chain: The chain of what is sent, when already known; computed here otherwise.
        :param held: The references of the offloaded results `messages` hold: when any, the read tool is offered.
        :param kept: The conversation was sent with the read tool before: it is offered with `messages` whatever they
            hold (`proxy.pipeline.offload.offloading.Offloading.offer`).
        :param tokens: The estimated prompt tokens of `messages`, when the exchange has no estimate of its own.
        """
        offered = held if messages else ()
        if exchange.estimate is not None:
            tokens = exchange.estimate.tokens
        request, reads = await self.offloading.offer(
            exchange.request,
            exchange.wire,
            exchange.tenant,
            offered,
            exchange.headers,
            kept=kept and bool(messages),
            sized=(exchange.window, tokens),
            originals=lambda: self.work.originals(exchange),
        )
        ask_usage = self.mode is Mode.ENFORCE and exchange.wire.asks_usage(request)
        # What the conversation's previous request was forwarded as counts only for messages the proxy rewrites.
        previous = self.previous_forwards.find(exchange.scope, exchange.original) if messages is not None else None

        splicing = exchange.wire.splicing

        def build() -> tuple[Forwarding, Any, list[bytes]]:
            sent = request.messages if messages is None else messages
            sent_chain = chain if chain is not None else chain_keys([message_key(message) for message in sent])
            if splicing is not None:
                body, spliced = splicing.forward(exchange.turn, raw, request, messages, ask_usage=ask_usage)
                return Forwarding(body), spliced, sent_chain
            return request.forwarded(raw, messages, previous), None, sent_chain

        spliced = splicing is not None and messages is not None and splicing.splices(exchange.turn, messages)
        whole = messages is not None and not spliced
        forwarded, exchange.turn.forwarded, exchange.chain = await self.work.run(exchange, build, whole=whole)
        self.previous_forwards.remember(
            exchange.scope, exchange.original, forwarded.replay_state, forwarded.replay_bytes
        )
        return ForwardPlan(
            body=forwarded.body,
            header_values=dict(forwarded.header_values),
            response_headers=dict(exchange.headers) or {"X-Compaction": "unchanged"},
            stream=request.stream,
            strip_usage_chunk=ask_usage,
            context=exchange,
            reads=reads,
            model=shown(exchange.model),
        )
