"""What the client is told of a request's compaction: the response headers, whatever its wire format."""

from __future__ import annotations

from typing import Final

from proxy.engine import Outcome, Thresholds

WINDOW_SOURCE_HEADER: Final = "X-Compaction-Window-Source"
"""Response header saying where the request's window came from (`proxy.windows.WindowSource`)."""

INSTRUCTIONS_HEADER: Final = "X-Compaction-Instructions"
"""Response header saying that the leading instructions and the tools alone reach the target (`over-target`: the
rest was compacted as far as the rules allow) or exceed the window (`over-window`: forwarded as it came)."""


INVALID_WINDOW_WARNING: Final = "X-Context-Window ignored: not a positive integer"
"""`X-Compaction-Warning` when a request's `X-Context-Window` is not a window: the request is served as without it."""


def requested_window(value: str | None) -> tuple[int | None, str | None]:
    """The window an `X-Context-Window` header asks for, and the warning to answer when it asks for none.

    :returns: `(tokens, None)` for a positive integer, `(None, None)` when absent, `(None, warning)` otherwise.
    """
    if value is None:
        return None, None
    text = value.strip()
    if len(text) <= 12 and text.isascii() and text.isdigit() and int(text) > 0:
        return int(text), None
    return None, INVALID_WINDOW_WARNING


def report_headers(outcome: Outcome, thresholds: Thresholds, *, observed: bool = False) -> dict[str, str]:
    """Response headers telling the client what was decided.

    `X-Compaction-Tokens-Before` is always an integer; `X-Compaction-Tokens-Before-Bound: true` says it is an upper
    bound (a request clearly under the trigger is sized by its bytes, not tokenized). `X-Compaction-Reserved` gives the
    reply's reservation when it, not `compact_at`, set the trigger of a compaction. `X-Compaction-Instructions` says
    when the leading instructions and the tools alone leave no room (see `proxy.engine.Room`).

    A request of a client that compacts itself, forwarded without compacting, is `deferred`.

    :param observed: Observe mode: what compaction would have done is reported as `would-compact`, never `compacted`.
    """
    decision = outcome.decision
    compacted = "would-compact" if observed else "compacted"
    decided = compacted if outcome.result else left_as_sent(thresholds)
    headers = estimate_headers(decided, thresholds, decision.estimated_tokens, bounded=decision.bounded)
    if outcome.room is not None:
        headers[INSTRUCTIONS_HEADER] = outcome.room.value
    if outcome.result:
        headers["X-Compaction-Tokens-After"] = str(outcome.tokens_after)
        headers["X-Compaction-Strategies"] = ",".join(outcome.result.strategies)
        if thresholds.reservation_decides:
            headers["X-Compaction-Reserved"] = str(thresholds.reserved_tokens)
    return headers


def estimate_headers(decided: str, thresholds: Thresholds, tokens: int, *, bounded: bool) -> dict[str, str]:
    """The headers every decided request answers (see `report_headers`): what was decided, the window, the estimate.

    :param decided: The `X-Compaction` value.
    :param tokens: The estimate before compacting; an upper bound when `bounded`.
    """
    headers = {
        "X-Compaction": decided,
        "X-Compaction-Context-Window": str(thresholds.context_window),
        "X-Compaction-Tokens-Before": str(tokens),
    }
    if bounded:
        headers["X-Compaction-Tokens-Before-Bound"] = "true"
    return headers


def left_as_sent(thresholds: Thresholds) -> str:
    """What a request forwarded without compacting is reported as: `deferred` to a client that compacts itself."""
    return "deferred" if thresholds.client_compacts else "unchanged"
