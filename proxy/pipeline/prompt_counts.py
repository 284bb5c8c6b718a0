"""A client's own prompt counts (the Messages API's `count_tokens`), sent for the conversation as the proxy forwards it.

The client counts the history it holds; the upstream is sent that history rewritten. Passed through, the count
describes a conversation the upstream never sees, and on a model that binds thinking to its prefix it is refused:
the client's latest thinking blocks were signed over the proxy's rewritten prefix, and the count runs the same prefix
check as creating a message. So a count of a conversation the proxy rewrote is shaped as the matching request would
be forwarded: the remembered rewrite replayed (`RewriteMemory`), the read tool declared where the forwarded request
declares it, and the format's binding rules applied against what the conversation's previous request was forwarded
as. A conversation the proxy never rewrote is counted as the client sent it.

What a count describes is the conversation before any compaction of its own turn: a count made on the turn that
compacts anew counts the replayed conversation, not the smaller one forwarded after it. Nothing is remembered,
offloaded, summarized or learned for a count.
"""

from __future__ import annotations

from proxy.config import Settings
from proxy.pipeline.caller import Caller
from proxy.pipeline.exchange import ForwardPlan, IncomingRequest
from proxy.pipeline.offload.offloading import Offloading
from proxy.pipeline.prepared import Prepared
from proxy.pipeline.previous_forwards import PreviousForwards
from proxy.pipeline.request_work import RequestWork
from proxy.pipeline.requests import InvalidRequest, RequestOverLimit


class PromptCounts:
    """Shapes requests to a format's prompt-counting endpoint (`WireFormat.prompt_counting`).

    :param settings: The tenant key and the conversation settings a caller is scoped by.
    :param work: Parses and replays (off the event loop when large).
    :param offloading: Declares the read tool where the forwarded request holds offloaded results.
    :param previous_forwards: What each conversation's latest request was forwarded as (binding rules build on it).
    """

    def __init__(
        self, settings: Settings, work: RequestWork, offloading: Offloading, previous_forwards: PreviousForwards
    ) -> None:
        self.settings = settings
        self.work = work
        self.offloading = offloading
        self.previous_forwards = previous_forwards

    async def plan(self, incoming: IncomingRequest) -> ForwardPlan | None:
        """The count request to send, with the header values its body needs; None to send the client's as it came.

        None too for a body that is not a request the format parses: the upstream answers it with its own error.
        """
        counting = incoming.wire.prompt_counting
        if counting is None:
            return None
        headers = {key.lower(): value for key, value in incoming.headers.items()}
        caller = Caller.of(headers, self.settings, incoming.wire.scope)
        try:
            request = await self.work.parse(incoming.body, incoming.wire)
        except (InvalidRequest, RequestOverLimit):
            return None
        model = incoming.wire.model(request, incoming.path)
        exchange = Prepared(caller.scope, caller.tenant, request, model, None, len(incoming.body), incoming.wire)
        view = await self.work.view(exchange)
        if not view.changed:
            return None
        offered, _ = await self.offloading.offer(
            request, incoming.wire, caller.tenant, view.held, {}, kept=view.read_tool
        )
        previous = self.previous_forwards.find(caller.scope, view.original_chain)

        def build() -> tuple[bytes, dict[str, str]]:
            forwarded = offered.forwarded(incoming.body, view.messages, previous)
            return counting.body(forwarded.body), dict(forwarded.header_values)

        body, header_values = await self.work.run(exchange, build, whole=True)
        return ForwardPlan(body=body, header_values=header_values, model=model)
