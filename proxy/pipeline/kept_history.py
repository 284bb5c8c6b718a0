"""Requests that continue a history their provider keeps: forwarded as sent, the history's size learned.

A format declares it (`WireFormat.provider_history`, see `proxy.pipeline.capabilities.ProviderHistory`): such a
request carries only what is new, so there is nothing to compact. The pipeline forwards it as sent (or with the
provider's own context management asked for, once the history grows past the trigger) and learns the history's
size from every answer of the format, so a later request continuing it is sized.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from proxy.config import Mode, Settings
from proxy.discovery.service import WindowDiscovery
from proxy.engine import counter_for_model
from proxy.names import shown
from proxy.pipeline.caller import Caller
from proxy.pipeline.capabilities import HistorySizes
from proxy.pipeline.exchange import ForwardPlan, IncomingRequest, UpstreamOutcome
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.per_format import PerFormat
from proxy.pipeline.prepared import Prepared
from proxy.pipeline.wire import WireFormat
from proxy.state import StateStore


class KeptHistories:
    """Decides requests continuing a provider-kept history, and learns each history's size from the answers.

    :param settings: The proxy's settings (`mode`, and what `ProviderHistory.sizes` reads).
    :param store: Where the sizes are kept.
    :param discovery: Resolves the request's window (the trigger the history's size is compared with).
    :param metrics: The pipeline's metrics, as they are when asked (they move to the app's registry).
    """

    def __init__(
        self,
        settings: Settings,
        store: StateStore,
        discovery: WindowDiscovery,
        metrics: Callable[[], CompactionMetrics],
    ) -> None:
        self.observed = settings.mode is Mode.OBSERVE
        self.discovery = discovery
        self.metrics = metrics
        self.sizes: PerFormat[HistorySizes] = PerFormat(
            lambda wire: wire.provider_history.sizes(store, settings) if wire.provider_history is not None else None
        )

    def continues(self, wire: WireFormat, request: Any) -> bool:
        """Whether the request continues a history its provider keeps."""
        return wire.provider_history is not None and wire.provider_history.continues(request)

    async def prepare(
        self, incoming: IncomingRequest, request: Any, headers: Mapping[str, str], caller: Caller
    ) -> ForwardPlan:
        """The plan for a request `continues` said yes to: as sent, or asking the provider to manage its context."""
        sizes = self.sizes.of(incoming.wire)
        assert sizes is not None  # `continues` said the format keeps histories
        model = request.model
        resolved = await self.discovery.resolve(model, caller.requested_window, caller.tenant, headers)
        window = resolved.tokens if resolved else None
        exchange = Prepared(
            caller.scope, caller.tenant, request, model, window, len(incoming.body), incoming.wire, provider_state=True
        )
        body, state = await sizes.forwarded(incoming.body, request, caller.scope, window, counter_for_model(model))
        self.metrics().decided(incoming.wire.name, "provider_state")
        return ForwardPlan(
            body=incoming.body if self.observed else body,
            response_headers={"X-Compaction": "provider-state" if self.observed else state},
            stream=request.stream,
            context=exchange,
            model=shown(model),
        )

    async def learn(self, exchange: Prepared, outcome: UpstreamOutcome) -> None:
        """Keep the size of the history through a 2xx answer with an id, for any request of a format keeping them."""
        sizes = self.sizes.of(exchange.wire)
        if outcome.response_id is not None and sizes is not None:
            await sizes.learn(exchange.scope, exchange.request, outcome.response_id, outcome.usage)
