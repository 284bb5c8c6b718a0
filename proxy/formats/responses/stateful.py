"""Responses conversations whose history the provider keeps: what the proxy can still do for them.

With `previous_response_id` (or `conversation`) a request carries only what is new; the history lives at the
provider, out of the proxy's reach. The proxy forwards such a request as sent and says so (`X-Compaction:
provider-state`). It still knows how big the chain is: every response's reported usage (input plus output) is kept
against its id (and its conversation's), so a request continuing response R is estimated as R's size plus its own
new items. Once that passes `compact_at` of the window, and the client set no context management of its own, the
proxy adds what the operator chose (`provider_state`): the provider's own compaction (`context_management` with
`compact_threshold` at `compact_at` of the window) or `truncation: auto`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from xxhash import xxh3_128_digest

from proxy.config import ProviderState, Settings
from proxy.engine import TokenCounter, Transcript
from proxy.engine.json_bytes import json_bytes
from proxy.formats.responses.request import ResponsesRequest
from proxy.state import StateStore

PROVIDER_STATE: Final = "provider-state"
"""`X-Compaction` of a request continuing a conversation the provider keeps, forwarded as sent."""

ASKED: Final = {ProviderState.COMPACTION: "provider-compaction", ProviderState.TRUNCATION: "provider-truncation"}
"""`X-Compaction` when the proxy asked the provider to manage the context itself."""


def chain_key(name: str) -> bytes:
    """The state key under which the size of a provider-kept chain is kept (within the caller's scope).

    :param name: `response:<id>` or `conversation:<id>` (see `ResponsesRequest.provider_chain`).
    """
    return xxh3_128_digest(b"provider-chain\0" + name.encode("utf-8", "surrogatepass"))


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

    async def learn(
        self, scope: bytes, request: ResponsesRequest, response_id: str, usage: Mapping[str, Any] | None
    ) -> None:
        """Keep the size of the conversation through this response (its input and its output).

        It is kept for the response (a later `previous_response_id`) and, when the request named a `conversation`,
        for the conversation.
        """
        total = usage.get("total_tokens") if usage else None
        if not isinstance(total, int) or isinstance(total, bool) or total <= 0:
            return
        await self.store.save_anchor(scope, chain_key("response:" + response_id), total)
        named = request.provider_chain
        if named is not None and named.startswith("conversation:"):
            await self.store.save_anchor(scope, chain_key(named), total)

    async def forwarded(
        self, raw: bytes, request: ResponsesRequest, scope: bytes, window: int | None, counter: TokenCounter
    ) -> tuple[bytes, str]:
        """The body to send for a provider-kept conversation, and its `X-Compaction` value."""
        named = request.provider_chain
        if self.action is ProviderState.OFF or request.manages_context or window is None or named is None:
            return raw, PROVIDER_STATE
        found = await self.store.latest_anchor(scope, [chain_key(named)])
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
        return json_bytes({**request.body, **added}), ASKED[self.action]


class ResponsesHistory:
    """The Responses API's `ProviderHistory` (see `proxy.pipeline.capabilities`): `ProviderChains`."""

    def continues(self, request: ResponsesRequest) -> bool:
        """A request with `previous_response_id` or `conversation` (`ResponsesRequest.stateful`)."""
        return request.stateful

    def sizes(self, store: StateStore, settings: Settings) -> ProviderChains:
        """The chains' sizes in `store`, acted on as `provider_state` and `compact_at` say."""
        return ProviderChains(store, settings.provider_state, settings.compact_at)
