"""Exact counts: the upstream's own count of a prompt, asked within a small budget, from a source each format names.

A local tokenizer is exact only for OpenAI's models; calibration corrects it from the provider's usage reports, but
only from the second request of a conversation on. Where the upstream can count a prompt (a server exposing its
tokenizer and chat template, the Responses API's `input_tokens`, the Messages API's `count_tokens`), the first
request's size can be exact too. Each format names where its counts come from (`WireFormat.exact_counting`, see
`proxy.pipeline.capabilities.ExactCountSource`); a format naming none is measured with the local count.

- The count of a prefix of a conversation (template, tools and generation prompt included: the `prompt_tokens` it
  would be reported with) is an anchor like a usage report. Whichever covers more messages is what the trigger
  rests on; the calibrated local count covers what neither does, and is calibrated from it.
- Asked where it matters: when no usage report covers the conversation (its first request, the first after a
  compaction changed what is sent) or what follows the report is large (`reported`).
- Bounded wait: a request waits at most `exact_count_timeout`; then it is measured with the local count and the
  answer, when it comes, serves the next request (see `proxy.discovery.budgeted`).
- Fail open: a count that fails, times out or is implausible changes nothing but a metric.
- The requests carry the caller's own messages to the upstream that request goes to, with the caller's
  credential headers, as the request itself does.
"""

from __future__ import annotations

import logging
from typing import Final

from proxy.config import Settings
from proxy.discovery.budget import ProbeBudget
from proxy.discovery.budgeted import BudgetedAnswers
from proxy.engine import Anchor, counter_for_model
from proxy.failures import log_failure
from proxy.pipeline.capabilities import CountContext, CountQuestion, ExactCountSource
from proxy.pipeline.measured import Measured
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.per_format import PerFormat
from proxy.pipeline.rewrites import View
from proxy.pipeline.wire import WireFormat

logger = logging.getLogger("compaction_proxy.compaction")

MAX_COUNTS: Final = 65_536
"""Prefix counts remembered (about 100 bytes each); the least recently used are forgotten first."""
MAX_COUNTED_BYTES: Final = 4 * 2**20
"""The largest request body counted exactly: far beyond any window in text, while a larger one (images, files, or an
attack) would cost the upstream and the proxy's event loop more than its count is worth."""
REPORTED_SHARE: Final = 0.25
"""A request whose usage-reported prefix is followed by messages whose byte bound is under this share of the report
asks nothing: their tokens are a few percent of the request at most, so the calibrated local count's error on them
(about 1% here) moves the estimate by less than a count is worth waiting for."""
COUNT_HEADER: Final = "X-Compaction-Count"
"""Response header: `exact` when the estimate rests on the upstream's exact count of the whole request."""


class ExactCounts:
    """Asks each request's format's source for its exact count, and compares the counts with local ones.

    :param settings: `count_probes`, `exact_count_timeout`, and the upstream.
    :param metrics: Where the outcome of each request's count and the local count's error are counted.
    :param budget: The probe budget tries of methods that never answered are charged to (shared with discovery).
    """

    def __init__(self, settings: Settings, metrics: CompactionMetrics, budget: ProbeBudget | None = None) -> None:
        self.metrics = metrics
        self.counts: BudgetedAnswers[int] = BudgetedAnswers(settings.exact_count_timeout, MAX_COUNTS)
        context = CountContext(settings, budget or ProbeBudget.of(settings), self.counts)
        self.sources: PerFormat[ExactCountSource] = PerFormat(
            lambda wire: wire.exact_counting.source(context) if wire.exact_counting is not None else None
        )

    async def anchor(self, wire: WireFormat, question: CountQuestion) -> Anchor | None:
        """The exact count of the longest prefix of the view known, asking for the whole view within the budget.

        Nothing is asked when the provider's usage report already covers the view but for a small tail (see
        `REPORTED_SHARE`): the report is as exact, and the calibrated local count of the tail is off by too little
        to pay a request for.

        :param wire: The request's format, which names the source.
        :param question: The request and its view (a body over `MAX_COUNTED_BYTES` is not counted).
        """
        try:
            source = self.sources.of(wire)
            if source is None:
                return None
            counted = await source.count(question)
        except Exception as error:
            log_failure(logger, "Exact counting failed; this request is measured with the local count.", error)
            return None
        if counted.outcome is not None:
            self.metrics.exact_counts.labels(counted.outcome).inc()
        return counted.anchor

    def may_ask(self, wire: WireFormat, tenant: bytes) -> bool:
        """Whether the tenant's request of this format could be counted exactly now (its source would ask)."""
        source = self.sources.of(wire)
        return source is not None and source.may_ask(tenant)

    def record(self, measured: Measured) -> dict[str, str]:
        """Count how far the local estimate was from the exact count; the response headers saying what was used."""
        if measured.local_tokens is None:
            return {}
        if measured.exact is None:
            self.metrics.exact_counts.labels("implausible").inc()
            return {}
        exact = measured.exact.tokens
        self.metrics.local_count_error.observe((measured.local_tokens - exact) / max(exact, 1))
        whole = measured.exact.covered >= len(measured.transcript)
        return {COUNT_HEADER: "exact"} if whole and measured.anchor is measured.exact else {}

    async def aclose(self) -> None:
        """Stop the counts in flight and close the sources' HTTP clients."""
        await self.counts.aclose()
        for source in self.sources.made():
            await source.aclose()


def reported(model: str, usage: Anchor | None, view: View) -> bool:
    """Whether a usage report covers the view but for a tail whose byte bound is under `REPORTED_SHARE` of it."""
    if usage is None or usage.tokens <= 0:
        return False
    counter, limit, tail = counter_for_model(model), REPORTED_SHARE * usage.tokens, 0
    for index in range(usage.covered, len(view.messages)):  # islice would step through the covered ones
        tail += counter.message_upper_bound(view.messages[index])
        if tail >= limit:  # stop early: a tail of many messages is not walked to its end on the event loop
            return False
    return True
