"""The Messages API's exact counts: `POST /v1/messages/count_tokens` for what a request forwards.

The endpoint takes a request's prompt fields (`model`, `system`, `tools`, `tool_choice`, `thinking`, `messages`:
`tokens.count_tokens_body`) and answers `{"input_tokens": N}`, what the same request would report as its prompt. It
counts the whole prompt each time, so answers are remembered by the counted body: a request sent again asks
nothing. It is free but rate-limited per organization, and asked with the caller's own credential and version
headers, so it runs only when `count_probes` names `anthropic_count_tokens` (opt-in), within `exact_count_timeout`
like every exact count, and only where it matters: not when the usage report covers all but a small tail of the
conversation (`proxy.pipeline.exact_counts.reported`). It is the format's `WireFormat.exact_counting`
(`CountTokensCounting`).

A refusal backs the tenant off as the chat count methods' failures do (`proxy.discovery.trials`: a minute, doubling
to an hour), a 429 for at least as long as its `retry-after` says: one tenant's rate limit delays no other tenant's
counts, and a rate-limited tenant asks nothing until the limit has passed. A request the endpoint found invalid (a
400: the same request will be refused upstream too) backs nothing off.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
from xxhash import xxh3_128_digest

from proxy.config import Settings
from proxy.discovery.budgeted import BudgetedAnswers, Outcome
from proxy.discovery.client import ProbeClient, credentials_of
from proxy.discovery.service import probes_for
from proxy.discovery.trials import MAX_BACK_OFF, back_off_seconds
from proxy.engine import Anchor
from proxy.engine.bounded import BoundedCache
from proxy.formats.anthropic.request import MessagesRequest
from proxy.formats.anthropic.tokens import count_tokens_body
from proxy.pipeline.capabilities import CountContext, Counted, CountQuestion
from proxy.pipeline.exact_counts import MAX_COUNTED_BYTES, reported
from proxy.pipeline.rewrites import View

PATH: Final = "/v1/messages/count_tokens"
COUNTED_PATH: Final = re.compile(r"^(?:/[^/]+)*/v1/messages/count_tokens/?$")
"""A client's `count_tokens`, with any base-path prefix."""
PROBE: Final = "anthropic_count_tokens"
"""Its name in `count_probes`."""
VERSION_HEADERS: Final = ("anthropic-version", "anthropic-beta")
"""Request headers the count carries as the caller sent them: the API's version and the betas that change the prompt."""
MAX_COUNTS: Final = 16_384
"""Counts remembered (by tenant and a digest of the counted body; about 100 bytes each)."""
KEY_PREFIX: Final = PROBE.encode() + b":"
"""What its keys start with in answers shared with other sources."""
MAX_TENANTS: Final = 65_536
"""Tenants whose back-off is remembered; the least recently refused are forgotten first."""


@dataclass(frozen=True)
class _Waiting:
    until: float
    failures: int


class CountTokens:
    """Counts what a Messages request forwards with the API's `count_tokens` (an exact-count source).

    :param settings: `count_probes` (off unless it names `anthropic_count_tokens`), `exact_count_timeout`, the
        upstream and its TLS trust.
    :param answers: The counts in flight and remembered, when shared with other sources (its keys start with
        `KEY_PREFIX`); one of its own otherwise.
    :param clock: Monotonic seconds, for the back-off.
    """

    def __init__(
        self,
        settings: Settings,
        answers: BudgetedAnswers[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.enabled = PROBE in probes_for(settings, "count_probes")
        self._own_answers = answers is None
        self.counts = answers if answers is not None else BudgetedAnswers(settings.exact_count_timeout, MAX_COUNTS)
        self.clock = clock
        self._waiting: BoundedCache[bytes, _Waiting] = BoundedCache(MAX_TENANTS)
        self.client = ProbeClient(settings)

    async def count(self, question: CountQuestion) -> Counted:
        """The count of the whole view (what the request forwards before any new compaction), and how asking went.

        Nothing is asked when the provider's usage report covers the view but for a small tail (`reported`), nor for
        a body over `MAX_COUNTED_BYTES`. The caller's credential and version headers go with the count.
        """
        request: MessagesRequest = question.request
        model, view, tenant = question.model, question.view, question.tenant
        if not self.enabled or not view.messages or not model or question.size > MAX_COUNTED_BYTES:
            return Counted()
        if reported(model, question.usage, view):
            return Counted(outcome="reported")
        body = count_tokens_body(self._fields(request, view))
        key = KEY_PREFIX + tenant + xxh3_128_digest(body)
        if self.counts.known(key) is None and not self.may_ask(tenant):
            return Counted(outcome=Outcome.FAILED)
        headers = question.headers
        sent = {**credentials_of(headers), **{name: headers[name] for name in VERSION_HEADERS if headers.get(name)}}
        tokens, outcome = await self.counts.ask(key, lambda: self._ask(body, tenant, sent))
        return Counted(Anchor(tokens=tokens, covered=len(view.messages)) if tokens else None, outcome)

    def may_ask(self, tenant: bytes) -> bool:
        """Whether counting is on and the tenant is not waiting out a back-off."""
        waiting = self._waiting.get(tenant)
        return self.enabled and (waiting is None or self.clock() >= waiting.until)

    async def aclose(self) -> None:
        """Stop the counts in flight (when the answers are its own) and close the HTTP client."""
        if self._own_answers:
            await self.counts.aclose()
        await self.client.aclose()

    @staticmethod
    def _fields(request: MessagesRequest, view: View) -> Mapping[str, Any]:
        """The request's fields with the view's `system` and `messages` (its own when the view is the client's)."""
        if not view.changed:
            return request.body
        mapped = request.mapped(view.messages)
        return request.fields_with(mapped.system, mapped.messages)

    async def _ask(self, body: bytes, tenant: bytes, headers: Mapping[str, str]) -> int | None:
        """Ask the endpoint; back the tenant off when it refuses (see the module docstring)."""
        answer = await self.client.send("POST", PATH, body, headers)
        status = answer.status if answer is not None else None
        tokens = _input_tokens(answer.payload) if answer is not None else None
        if tokens is not None:
            if self._waiting.get(tenant) is not None:
                self._waiting.put(tenant, _Waiting(0.0, 0))
            return tokens
        if status != 400:
            self._back_off(tenant, _retry_after(answer.headers) if answer is not None and status == 429 else 0.0)
        return None

    def _back_off(self, tenant: bytes, at_least: float) -> None:
        failures = 1 + (waiting.failures if (waiting := self._waiting.get(tenant)) else 0)
        self._waiting.put(tenant, _Waiting(self.clock() + max(at_least, back_off_seconds(failures)), failures))


class CountedPrompts:
    """The Messages API's `PromptCounting`: a client's `count_tokens`, whose body is a request's prompt fields."""

    def serves(self, path: str) -> bool:
        """`COUNTED_PATH`."""
        return COUNTED_PATH.match(path) is not None

    def body(self, forwarded: bytes) -> bytes:
        """The forwarded body's prompt fields (`count_tokens_body`)."""
        return count_tokens_body(orjson.loads(forwarded))


class CountTokensCounting:
    """The Messages API's `ExactCounting`: `CountTokens`, sharing the pipeline's remembered counts."""

    def source(self, context: CountContext) -> CountTokens:
        """A `CountTokens` for this context (asking nothing unless `count_probes` names `PROBE`)."""
        return CountTokens(context.settings, context.answers)


def _input_tokens(payload: bytes | None) -> int | None:
    """`input_tokens` of an answer, when it is a positive integer in a JSON object."""
    if payload is None:
        return None
    try:
        answer = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    tokens = answer.get("input_tokens") if isinstance(answer, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else None


def _retry_after(headers: Mapping[str, str]) -> float:
    """The seconds a 429's `retry-after` asks to wait (0 when it says nothing readable), at most `MAX_BACK_OFF`."""
    try:
        seconds = float(headers.get("retry-after", "0"))
    except ValueError:
        return 0.0
    return min(max(seconds, 0.0), MAX_BACK_OFF) if math.isfinite(seconds) else 0.0
