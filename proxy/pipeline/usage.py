"""What the provider's usage reports teach the proxy: anchors for the next estimate, calibration, windows that fit.

A report anchors the next request of its conversation (its `prompt_tokens` for what was sent, its `total_tokens`
through the reply), so one wild number would steer that conversation's compaction for good. Every report is
therefore checked against the proxy's own estimate of the same request first, and ignored (and counted) when the two
are further apart than any tokenizer difference explains. Calibrations are learned per tenant and model, in a
bounded table, so no caller's conversations move another's estimates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Protocol

from proxy.engine import Anchor, Calibration
from proxy.engine.bounded import BoundedCache
from proxy.engine.calibration import RATIO_BOUNDS
from proxy.engine.counting import counter_for_model
from proxy.engine.messages import chain_keys, message_key
from proxy.names import name_key
from proxy.pipeline.metrics import CompactionMetrics
from proxy.state import StateStore
from proxy.state.base import latest_from
from proxy.windows import MAX_LEARNED, ContextWindows

PLAUSIBILITY_SLACK: Final = 256
"""Tokens a report may differ from the estimate by beyond `RATIO_BOUNDS`: templates and small requests vary most."""


@dataclass(frozen=True)
class Estimate:
    """The proxy's estimate of a request it forwarded, in the provider's tokens.

    :param tokens: The estimate.
    :param bound: Only a cheap upper bound was computed (the request was clearly under the trigger).
    """

    tokens: int
    bound: bool = False

    def admits(self, reported: int, local: int = 0) -> bool:
        """Whether a provider count of `reported` tokens is plausible for this estimate (plus `local` more tokens)."""
        low, high = RATIO_BOUNDS
        expected = self.tokens + local
        if reported > high * expected + PLAUSIBILITY_SLACK:
            return False
        return self.bound or reported >= low * expected - PLAUSIBILITY_SLACK


class Sent(Protocol):
    """What was forwarded for one request, as the usage report of its answer needs it (a `Prepared` is one)."""

    @property
    def scope(self) -> bytes:
        """The state scope (tenant, and the per-request window override if any)."""
        ...

    @property
    def tenant(self) -> bytes:
        """The caller's tenant."""
        ...

    @property
    def model(self) -> str | None:
        """The model asked for."""
        ...

    @property
    def chain(self) -> list[bytes]:
        """The hash chain of the messages sent upstream (empty for a request sized by its bytes)."""
        ...

    @property
    def estimate(self) -> Estimate | None:
        """The proxy's estimate of what was sent, or None when it made none."""
        ...


class UsageReports:
    """Anchors, calibrations and fits learned from the provider's reports.

    :param store: Where anchors live.
    :param windows: Told what size of request the provider answered, so no learned window goes below it.
    :param metrics: Where the estimate error and ignored reports are counted.
    """

    def __init__(self, store: StateStore, windows: ContextWindows, metrics: CompactionMetrics) -> None:
        self.store = store
        self.windows = windows
        self.metrics = metrics
        self._calibrations: BoundedCache[bytes, Calibration] = BoundedCache(MAX_LEARNED)

    async def anchor(self, scope: bytes, sent_chain: list[bytes], since: int | None = None) -> Anchor | None:
        """The provider's count for the longest known prefix of what is about to be sent.

        :param since: Where the conversation's anchor was found on its last turn: looked up from there first.
        """
        if not sent_chain:
            return None
        found = await latest_from(partial(self.store.latest_anchor, scope), sent_chain, since)
        return Anchor(tokens=found[1], covered=found[0] + 1) if found else None

    def calibration(self, tenant: bytes, model: str | None) -> Calibration:
        """The calibration of local counts against the provider's, for this tenant and model."""
        key = tenant + name_key(model)
        calibration = self._calibrations.get(key)
        if calibration is None:
            calibration = Calibration()
            self._calibrations.put(key, calibration)
        return calibration

    async def learn(self, sent: Sent, usage: Mapping[str, Any] | None, reply: Mapping[str, Any] | None) -> None:
        """Anchor a plausible report on what was sent (and, with the reply, on the conversation through it)."""
        prompt = _tokens(usage.get("prompt_tokens")) if usage else None
        if not usage or not prompt:
            return
        if sent.estimate is not None and not sent.estimate.admits(prompt):
            self.metrics.implausible_usage.inc()
            return
        if not sent.chain:
            # Nothing to anchor (a request sized by its bytes), but the report still shows what fits the window.
            self.windows.fitted(sent.model, prompt, sent.tenant)
            return
        await self.store.save_anchor(sent.scope, sent.chain[-1], prompt)
        fitted = prompt
        through_reply = _through_reply(usage, prompt)
        if reply is not None and through_reply is not None:
            reply_tokens = through_reply - prompt
            counter = counter_for_model(sent.model)
            if reply_tokens <= RATIO_BOUNDS[1] * counter.message_tokens(reply) + PLAUSIBILITY_SLACK:
                reply_chain = chain_keys([message_key(reply)], start=sent.chain[-1])[-1]
                await self.store.save_anchor(sent.scope, reply_chain, through_reply)
                fitted = through_reply
            else:
                self.metrics.implausible_usage.inc()
        self.windows.fitted(sent.model, fitted, sent.tenant)
        if sent.estimate is not None and not sent.estimate.bound:
            self.metrics.estimate_error.observe((sent.estimate.tokens - prompt) / prompt)


def _through_reply(usage: Mapping[str, Any], prompt: int) -> int | None:
    """The conversation's size through the reply: `total_tokens` less reasoning tokens, which the next prompt lacks."""
    total = _tokens(usage.get("total_tokens"))
    if total is None or total < prompt:
        return None
    details = usage.get("completion_tokens_details")
    reasoning = _tokens(details.get("reasoning_tokens")) if isinstance(details, Mapping) else None
    if reasoning and reasoning <= total - prompt:
        total -= reasoning
    return total


def _tokens(value: Any) -> int | None:
    """`value` when it is a token count (a non-negative int, not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
