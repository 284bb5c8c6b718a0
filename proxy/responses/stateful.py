"""Responses conversations whose history the provider keeps: what the proxy can still do for them.

With `previous_response_id` (or `conversation`) a request carries only what is new; the history lives at the
provider, out of the proxy's reach. The proxy forwards such a request as sent and says so (`X-Compaction:
provider-state`). It still knows how big the chain is: every response's reported usage (input plus output) is kept
against its id, so a request continuing response R is estimated as R's size plus its own new items. Once that passes
`compact_at` of the window, and the client set no context management of its own, the proxy adds what the operator
chose (`provider_state`): the provider's own compaction (`context_management` with `compact_threshold` at `compact_at`
of the window) or `truncation: auto`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson
from xxhash import xxh3_128_digest

from proxy.config import ProviderState
from proxy.engine import TokenCounter, Transcript
from proxy.responses.request import ResponsesRequest
from proxy.state import StateStore

PROVIDER_STATE: Final = "provider-state"
"""`X-Compaction` of a request continuing a conversation the provider keeps, forwarded as sent."""

ASKED: Final = {ProviderState.COMPACTION: "provider-compaction", ProviderState.TRUNCATION: "provider-truncation"}
"""`X-Compaction` when the proxy asked the provider to manage the context itself."""


def response_key(response_id: str) -> bytes:
    """The state key under which a response's size is kept (within the caller's scope)."""
    return xxh3_128_digest(b"response\0" + response_id.encode("utf-8", "surrogatepass"))


class ProviderChains:
    """Sizes of provider-kept chains, and what to ask of the provider when one grows past the trigger.

    :param store: Where each response's size is kept (scoped like every other state).
    :param action: What to ask of the provider (`provider_state`).
    :param compact_at: The trigger, as a fraction of the window.
    """

    def __init__(self, store: StateStore, action: ProviderState, compact_at: float) -> None:
        self.store = store
        self.action = action
        self.compact_at = compact_at

    async def learn(self, scope: bytes, response_id: str, usage: Mapping[str, Any] | None) -> None:
        """Keep the size of the conversation through this response (its input and its output)."""
        if not usage:
            return
        total = usage.get("total_tokens")
        if isinstance(total, int) and not isinstance(total, bool) and total > 0:
            await self.store.save_anchor(scope, response_key(response_id), total)

    async def forwarded(
        self, raw: bytes, request: ResponsesRequest, scope: bytes, window: int | None, counter: TokenCounter
    ) -> tuple[bytes, str]:
        """The body to send for a provider-kept conversation, and its `X-Compaction` value."""
        previous = request.previous_response_id
        if self.action is ProviderState.OFF or request.manages_context or window is None or previous is None:
            return raw, PROVIDER_STATE
        found = await self.store.latest_anchor(scope, [response_key(previous)])
        if found is None:
            return raw, PROVIDER_STATE
        trigger = int(self.compact_at * window)
        new = Transcript(request.messages, counter).total() + counter.overhead_tokens(request.overhead_fields)
        if found[1] + new < trigger:
            return raw, PROVIDER_STATE
        if self.action is ProviderState.COMPACTION:
            added: dict[str, Any] = {"context_management": [{"type": "compaction", "compact_threshold": trigger}]}
        else:
            added = {"truncation": "auto"}
        return orjson.dumps({**request.body, **added}), ASKED[self.action]
