"""The compaction side of a proxy with several routes: one pipeline per route over one state store.

Each route's pipeline talks to its own upstream only (summaries, window probes, exact counts go where the request
goes, with that route's TLS trust and timeouts) and keeps what is the upstream's in its own memory: windows learned
from it and its probes' answers, the recent bodies it splices against. What is the conversation's (rewrites, usage
anchors, offloaded results, summaries) lives in the one store, keyed as with a single upstream: by tenant and message
chain.
"""

from __future__ import annotations

from typing import Any

from proxy.config import Settings
from proxy.pipeline.exchange import ForwardPlan, IncomingRequest, Refusal, UpstreamOutcome
from proxy.pipeline.ledger import Clock, Ledger
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.service import CompactionPipeline
from proxy.state import StateStore, open_store


class RoutedPipelines:
    """A `Compaction` that hands each request to the pipeline of its route (`IncomingRequest.route`).

    :param settings: The proxy's settings; each route's pipeline gets them with the route's upstream settings
        (`Settings.for_route`).
    :param store: The state store every route shares; the one `settings.state_url` names when None.
    """

    def __init__(self, settings: Settings, store: StateStore | None = None) -> None:
        self.store = store or open_store(settings)
        self.ledger = Ledger()
        """One ledger for every route: a conversation is the same whichever upstream answers it."""
        table = settings.route_table()
        self.pipelines = {
            route.name: CompactionPipeline(settings.for_route(route), self.store, ledger=self.ledger) for route in table
        }
        self.fallback = self.pipelines[table[-1].name]
        """The `default` route's: the pipeline of a request that names no route it knows."""

    def _of(self, route: str) -> CompactionPipeline:
        return self.pipelines.get(route, self.fallback)

    def register_metrics(self, registry: Any) -> None:
        """Put the compaction metrics on the app's registry once; every route's pipeline counts into them."""
        metrics = CompactionMetrics(registry)
        for pipeline in self.pipelines.values():
            pipeline.use_metrics(metrics)

    def use_clock(self, clock: Clock) -> None:
        """Time the shared ledger's records by `clock` (see `CompactionPipeline.use_clock`)."""
        self.ledger.clock = clock

    async def warm_up(self) -> None:
        """Load the tokenizers (shared by every route) before the first request."""
        await self.fallback.warm_up()

    async def aclose(self) -> None:
        """Release every route's clients and worker threads, then the store."""
        for pipeline in self.pipelines.values():
            await pipeline.release()
        await self.store.close()

    async def unready_reason(self) -> str | None:
        """Why compaction cannot work now: the shared store's answer."""
        return await self.fallback.unready_reason()

    async def prepare(self, incoming: IncomingRequest) -> ForwardPlan | Refusal:
        """The plan of the request's route's pipeline, marked with the route for `complete`."""
        plan = await self._of(incoming.route).prepare(incoming)
        if isinstance(plan, ForwardPlan):
            plan.route = incoming.route
        return plan

    async def prepare_count(self, incoming: IncomingRequest) -> ForwardPlan | None:
        """The count request the request's route's pipeline sends (`CompactionPipeline.prepare_count`)."""
        return await self._of(incoming.route).prepare_count(incoming)

    async def complete(self, plan: ForwardPlan, outcome: UpstreamOutcome) -> ForwardPlan | None:
        """Report the outcome to the pipeline that made the plan; its retry stays on the same route."""
        retry = await self._of(plan.route).complete(plan, outcome)
        if retry is not None:
            retry.route = plan.route
        return retry


def build_pipeline(settings: Settings) -> CompactionPipeline | RoutedPipelines:
    """The compaction side of the proxy for these settings: one pipeline per route when there are several."""
    if len(settings.route_table()) > 1:
        return RoutedPipelines(settings)
    return CompactionPipeline(settings)
