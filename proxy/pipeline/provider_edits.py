"""The provider's own edits taken into the decision: what it will clear is not what the proxy must remove.

A request may ask its provider to clear old tool results on its side, or to compact (after which it reads from its
compaction block on) (`WireRequest.provider_edits`, the engine's `ProviderEdits`). The proxy decides on what the
provider will then process (`proxy.engine.provider_edits`):

- Estimated under the trigger after the provider's clearing, the request goes as sent: the provider brings it under
  the window itself.
- Still over it, the proxy compacts a transcript in which what the provider clears counts as what it leaves (its
  placeholder), so the chain spends its removal on what the provider keeps, and aims at the same target.

The upstream's usage report for a request asking for edits counts what the provider processed after them (when they
applied), not what was sent: it anchors no later estimate (`Prepared.provider_edited`), which is counted locally.

Reported beside the decision: `X-Compaction-Provider-Clears` (the tokens the provider is estimated to clear or drop
from what is forwarded) and `X-Compaction-Provider-Tokens` (what it is estimated to process), when the request asks for
clearing and its size was counted (not sized by its bytes).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Final

from proxy.engine import Outcome, Transcript
from proxy.engine.provider_edits import ProviderEdits, ProviderView, provider_view
from proxy.pipeline.measured import Measured

CLEARS_HEADER: Final = "X-Compaction-Provider-Clears"
"""Response header: the tokens the provider is estimated to clear on its side from the forwarded request."""

TOKENS_HEADER: Final = "X-Compaction-Provider-Tokens"
"""Response header: the tokens the provider is estimated to process after its own edits."""


def with_provider_edits(measured: Measured, edits: ProviderEdits | None) -> Measured:
    """`measured` decided on what the provider processes after `edits` (see the module docstring)."""
    decision = measured.decision
    if edits is None or not (edits.clearings or edits.reads_from_checkpoint) or decision.bounded:
        return measured
    view = provider_view(measured.transcript, edits, decision.estimated_tokens, decision.scale)
    if decision.compact and view.estimated_tokens < measured.thresholds.trigger_tokens:
        decision = replace(decision, compact=False, target_tokens=0, overhead_tokens=0)
    return replace(measured, decision=decision, provider=view)


def forwarded_view(
    measured: Measured, outcome: Outcome, edits: ProviderEdits | None, *, compacted: bool
) -> ProviderView | None:
    """What the provider will process of what is forwarded: its edits applied to the compacted request if `compacted`.

    None when the request asks for no clearing, or its size was not counted.
    """
    result = outcome.result
    if edits is None or measured.provider is None or result is None or not compacted:
        return measured.provider
    original = measured.transcript
    forwarded = Transcript(result.compacted.messages, original.counter, result.compacted.meta)
    scale = outcome.decision.scale
    sent = round(scale * forwarded.total()) + outcome.decision.overhead_tokens
    return provider_view(forwarded, edits, sent, scale)


def provider_headers(view: ProviderView | None, *, compacted: bool) -> dict[str, str]:
    """The report headers for what the provider is estimated to clear and process (none without a view).

    A compacted request's `X-Compaction-Tokens-After` stays what is forwarded, before the provider's edits: the
    chain measured what the provider leaves.
    """
    if view is None:
        return {}
    headers = {CLEARS_HEADER: str(view.cleared_tokens), TOKENS_HEADER: str(view.estimated_tokens)}
    if compacted:
        headers["X-Compaction-Tokens-After"] = str(view.estimated_tokens + view.cleared_tokens)
    return headers
