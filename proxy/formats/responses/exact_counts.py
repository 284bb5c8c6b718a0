"""The Responses API's exact counts: OpenAI's `/v1/responses/input_tokens` for what a request forwards.

The endpoint counts a whole request (see `proxy.discovery.input_tokens`): the proxy asks it about its view of the
request, the items it forwards, and anchors the whole view on the answer. Opt-in (`count_probes` names
`responses_input_tokens`): it is a call to OpenAI's API paid with the caller's key.
"""

from __future__ import annotations

from proxy.discovery.input_tokens import ResponsesInputTokens
from proxy.engine import Anchor
from proxy.formats.responses.request import ResponsesRequest
from proxy.pipeline.capabilities import CountContext, Counted, CountQuestion


class InputTokensCounts:
    """Counts a Responses request's input with OpenAI's endpoint (an `ExactCountSource`).

    :param context: The settings (`count_probes`, `exact_count_timeout`, the upstream).
    """

    def __init__(self, context: CountContext) -> None:
        self.input_tokens = ResponsesInputTokens(context.settings)

    async def count(self, question: CountQuestion) -> Counted:
        """The input tokens of what the request forwards (its view), as OpenAI counts them."""
        request: ResponsesRequest = question.request
        view = question.view
        if not self.input_tokens.enabled or not view.messages:
            return Counted()
        body = request.body
        if view.changed:
            items, instructions = request.units.forwarded_items(view.messages)
            body = {**body, "input": items, **({"instructions": instructions} if instructions is not None else {})}
        tokens, outcome = await self.input_tokens.count(body, question.tenant, question.headers)
        return Counted(Anchor(tokens=tokens, covered=len(view.messages)) if tokens else None, outcome)

    def may_ask(self, tenant: bytes) -> bool:
        """Whether counting is on."""
        return self.input_tokens.enabled

    async def aclose(self) -> None:
        """Stop the counts in flight and close the HTTP client."""
        await self.input_tokens.aclose()


class InputTokensCounting:
    """The Responses API's `ExactCounting`: `InputTokensCounts`."""

    def source(self, context: CountContext) -> InputTokensCounts:
        """An `InputTokensCounts` for this context."""
        return InputTokensCounts(context)
