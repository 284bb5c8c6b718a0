"""Exact counts: the upstream's own count of a chat prompt, asked within a small budget and remembered per prefix.

A local tokenizer is exact only for OpenAI's models; calibration corrects it from the provider's usage reports, but
only from the second request of a conversation on. Servers that expose their tokenizer and chat template (see
`proxy.discovery.tokenize`) can say the exact prompt size of the first request too.

- The count of a prefix of a conversation (template, tools and generation prompt included: the `prompt_tokens` it
  would be reported with) is an anchor like a usage report. Whichever covers more messages is what the trigger
  rests on; the calibrated local count covers what neither does, and is calibrated from it.
- Asked where it matters: when no usage report covers the conversation (its first request, the first after a
  compaction changed what is sent) or what follows the report is large. A conversation whose next request adds a
  few messages to a reported prefix asks nothing: the report is as exact as a count, and the calibrated local
  count of the few new messages is off by a fraction of a percent of the whole.
- Per prefix, remembered: counts are kept by the key of the prefix they count (the caller's tenant, the model, the
  template fields and the engine's hash chain), so a conversation sent again asks nothing, and one that grew asks
  only about the grown prompt (llama.cpp tokenizes only the new text). A count depends on the messages before it
  (templates insert default system prompts, mark the first or the last message), which is why the key is the
  prefix's chain and not a message's own key.
- Bounded wait: a request waits at most `exact_count_timeout`; then it is measured with the local count and the
  answer, when it comes, serves the next request (see `proxy.discovery.budgeted`).
- Which endpoint works is found once: the methods `count_probes` names are tried in order by the first requests;
  the first that answers is used from then on. One that never answered is asked again only after a back-off (a
  minute, doubling to an hour), never in a loop; the back-off is the asking tenant's, so one tenant's bad request
  delays no other tenant's counts, and tries are charged to the probe budget (see `proxy.discovery.trials`).
- Fail open: a count that fails, times out or is implausible changes nothing but a metric.
- The requests carry the caller's own messages to the upstream that request goes to, with the caller's
  credential headers, as the request itself does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

import orjson
from xxhash import xxh3_128_digest

from proxy.config import Settings
from proxy.discovery.budget import ProbeBudget, ProbeKind
from proxy.discovery.budgeted import BudgetedAnswers, Outcome
from proxy.discovery.client import CredentialsNeeded, ProbeClient, credentials_of
from proxy.discovery.input_tokens import ResponsesInputTokens
from proxy.discovery.service import probes_for
from proxy.discovery.tokenize import LOOK_BACK, TEMPLATE_FIELDS, Conversation, Method, methods
from proxy.discovery.trials import Trials
from proxy.engine import Anchor, counter_for_model
from proxy.failures import log_failure
from proxy.formats.chat_completions.request import ChatRequest
from proxy.formats.responses.request import ResponsesRequest
from proxy.names import name_key
from proxy.pipeline.measured import Measured
from proxy.pipeline.metrics import CompactionMetrics
from proxy.pipeline.rewrites import View
from proxy.pipeline.wire import WireRequest

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
    """Asks the upstream for exact prompt counts, remembers them per prefix, and compares them with local counts.

    :param settings: `count_probes`, `exact_count_timeout`, and the upstream.
    :param metrics: Where the outcome of each request's count and the local count's error are counted.
    :param budget: The probe budget tries of methods that never answered are charged to (shared with discovery).
    """

    def __init__(self, settings: Settings, metrics: CompactionMetrics, budget: ProbeBudget | None = None) -> None:
        known = methods()
        self.methods: list[tuple[str, Method]] = [
            (name, known[name]) for name in probes_for(settings, "count_probes") if name in known
        ]
        self.metrics = metrics
        self.client = ProbeClient(settings)
        self.counts: BudgetedAnswers[int] = BudgetedAnswers(settings.exact_count_timeout, MAX_COUNTS)
        self.responses = ResponsesInputTokens(settings)
        self.trials = Trials([name for name, _ in self.methods], budget or ProbeBudget.of(settings), ProbeKind.COUNT)

    async def anchor(
        self,
        model: str | None,
        request: WireRequest,
        view: View,
        tenant: bytes,
        headers: Mapping[str, str],
        *,
        size: int,
        usage: Anchor | None,
    ) -> Anchor | None:
        """The exact count of the longest prefix of the view known, asking for the whole view within the budget.

        Nothing is asked when the provider's usage report already covers the view but for a small tail (see
        `REPORTED_SHARE`): the report is as exact, and the calibrated local count of the tail is off by too little
        to pay a request for.

        :param request: The request: its template fields are counted with the messages. A Responses request is
            counted whole by OpenAI's `/v1/responses/input_tokens`, when `count_probes` names it.
        :param headers: The caller's headers (lower-cased names): its credential headers go with the count.
        :param size: The request body's size in bytes: a body over `MAX_COUNTED_BYTES` is not counted.
        :param usage: The usage report anchoring the view's longest reported prefix, if any.
        """
        try:
            if isinstance(request, ResponsesRequest):
                return await self._responses_anchor(request, view, tenant, headers)
            if not isinstance(request, ChatRequest):
                # No count source is wired for the other formats yet (the Messages API's `count_tokens`).
                return None
            if not self.methods or not model or not view.chain or size > MAX_COUNTED_BYTES:
                return None
            fields = {name: request.body[name] for name in TEMPLATE_FIELDS if name in request.body}
            scope = tenant + name_key(model) + xxh3_128_digest(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS))
            key = scope + view.chain[-1]
            known = self.counts.known(key)
            if known is not None:
                self.metrics.exact_counts.labels(Outcome.CACHED).inc()
                return Anchor(known, len(view.chain))
            if _reported(model, usage, view):
                self.metrics.exact_counts.labels("reported").inc()
                return None
            if not self.trials.usable(tenant):
                # Every method is waiting out this tenant's back-off: nothing would be asked.
                self.metrics.exact_counts.labels(Outcome.FAILED).inc()
                return None
            if not self.trials.admit(tenant):
                self.metrics.exact_counts.labels("refused").inc()
                return None
            conversation = Conversation(model, view.messages, fields, view.chain, scope)
            credentials = credentials_of(headers)
            _, outcome = await self.counts.ask(key, lambda: self._count(conversation, tenant, credentials))
            self.metrics.exact_counts.labels(outcome).inc()
            for covered in range(len(view.chain), max(len(view.chain) - LOOK_BACK, 0), -1):
                tokens = self.counts.known(scope + view.chain[covered - 1])
                if tokens is not None:
                    return Anchor(tokens, covered)
        except Exception as error:
            log_failure(logger, "Exact counting failed; this request is measured with the local count.", error)
        return None

    def may_ask(self, tenant: bytes, request: WireRequest) -> bool:
        """Whether the tenant's request could be counted exactly now, before the proxy decides on its size.

        Only a chat request is (`count_probes`' methods), while a method is not waiting out a back-off.
        """
        return isinstance(request, ChatRequest) and bool(self.trials.usable(tenant))

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
        """Stop the counts in flight and close the HTTP clients."""
        await self.counts.aclose()
        await self.client.aclose()
        await self.responses.aclose()

    async def _responses_anchor(
        self, request: ResponsesRequest, view: View, tenant: bytes, headers: Mapping[str, str]
    ) -> Anchor | None:
        """The input tokens of what a Responses request forwards (its view), as OpenAI counts them."""
        if not self.responses.enabled or not view.messages:
            return None
        body = request.body
        if view.changed:
            items, instructions = request.units.forwarded_items(view.messages)
            body = {**body, "input": items, **({"instructions": instructions} if instructions is not None else {})}
        tokens, outcome = await self.responses.count(body, tenant, headers)
        self.metrics.exact_counts.labels(outcome).inc()
        return Anchor(tokens=tokens, covered=len(view.messages)) if tokens else None

    async def _count(self, conversation: Conversation, tenant: bytes, credentials: Mapping[str, str]) -> int | None:
        """Ask each method usable for the tenant once, in order, until one answers with a count."""

        async def fetch(method: str, path: str, body: Mapping[str, Any] | None) -> Any:
            return await self.client.fetch(method, path, body, credentials)

        known: dict[str, Method] = dict(self.methods)
        for name in self.trials.usable(tenant):
            try:
                tokens = await known[name](fetch, conversation)
            except CredentialsNeeded:
                tokens = None
            if tokens is not None and tokens > 0:
                if self.trials.succeeded(name):
                    logger.info("The upstream counts prompts exactly (%s); estimates use its counts from now on.", name)
                return tokens
            self.trials.failed(name, tenant)
        return None


def _reported(model: str, usage: Anchor | None, view: View) -> bool:
    """Whether a usage report covers the view but for a tail whose byte bound is under `REPORTED_SHARE` of it."""
    if usage is None or usage.tokens <= 0:
        return False
    counter, limit, tail = counter_for_model(model), REPORTED_SHARE * usage.tokens, 0
    for index in range(usage.covered, len(view.messages)):  # islice would step through the covered ones
        tail += counter.message_upper_bound(view.messages[index])
        if tail >= limit:  # stop early: a tail of many messages is not walked to its end on the event loop
            return False
    return True
