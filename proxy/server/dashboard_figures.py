"""The dashboard's figures, computed from the metric ring: what each plots, its totals, and what it divides by.

Every figure reads metrics `/metrics` serves (named in `metrics`, so the page and the Grafana board say where a
number comes from) and never anything of a message. A share says what it divides by; a count divides by nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from proxy.server.metric_ring import Snapshot, Window

Change = Snapshot
"""What each series gained over some span (one minute, or the window), by sample name."""

Kind = Literal["count", "share", "ratio"]
"""How a value is shown: a count, a share of 1 (as a percentage), a signed ratio (as a percentage)."""

SHARE: Final[Kind] = "share"

ALL: Final = "all"


def summed(change: Change, name: str, by: str | None = None, **where: str) -> dict[str, float]:
    """The sample `name` summed by the value of label `by` (into `ALL` when None), over series matching `where`."""
    sums: dict[str, float] = {}
    for labels, value in change.get(name, {}).items():
        found = dict(labels)
        if any(found.get(label) != wanted for label, wanted in where.items()):
            continue
        key = found.get(by, "") if by is not None else ALL
        sums[key] = sums.get(key, 0.0) + value
    return sums


def total(change: Change, name: str, **where: str) -> float:
    """The sample `name` summed over every series matching `where`."""
    return summed(change, name, **where).get(ALL, 0.0)


def share(part: float, whole: float) -> float | None:
    """`part / whole`, or None when there is no whole to divide by."""
    return part / whole if whole else None


@dataclass(frozen=True)
class Item:
    """One figure's headline number over the window: `id` for scripts, `label` for people."""

    id: str
    label: str
    value: float | None
    kind: Kind = "count"


@dataclass(frozen=True)
class Figure:
    """One plot: its series per minute (from `series`), and its headline numbers over the window (from `items`)."""

    id: str
    title: str
    unit: str
    divides_by: str
    metrics: tuple[str, ...]
    series: Callable[[Change], dict[str, float | None]]
    items: Callable[[Change], list[Item]]
    kind: Kind = "count"

    def to_json(self, window: Window) -> dict[str, Any]:
        """The figure for `window`: each series' value per minute, and the headline numbers over the window.

        A count is 0 in a minute it counted nothing; a share or ratio is null there (nothing to divide by).
        """
        per_minute = [self.series(minute) for minute in window.minutes]
        idle = 0.0 if self.kind == "count" else None  # a minute without traffic counted nothing; a share has no whole
        names = sorted({name for minute in [*per_minute, self.series(window.total)] for name in minute})
        return {
            "id": self.id,
            "title": self.title,
            "unit": self.unit,
            "kind": self.kind,
            "divides_by": self.divides_by,
            "metrics": list(self.metrics),
            "series": [{"name": name, "values": [minute.get(name, idle) for minute in per_minute]} for name in names],
            "items": [vars(item) for item in self.items(window.total)],
        }


def _counts(values: Mapping[str, float]) -> dict[str, float | None]:
    """The series that counted anything (a series that stayed at zero is left out of the plot)."""
    return {name: value for name, value in values.items() if value}


def _requests(change: Change) -> dict[str, float]:
    by_route = summed(change, "compaction_proxy_requests_total", "route")
    return {route: count for route, count in by_route.items() if route != "internal"}


def _decisions(change: Change) -> dict[str, float]:
    found: dict[str, float] = {}
    for labels, value in change.get("compaction_proxy_decisions_total", {}).items():
        named = dict(labels)
        found[f"{named['route']} {named['decision']}"] = value
    return found


def _compacted(change: Change) -> dict[str, float]:
    decided = summed(change, "compaction_proxy_decisions_total", "decision")
    return {"compacted": decided.get("compacted", 0.0) + decided.get("compacted-after-overflow", 0.0)}


def _decision_items(change: Change) -> list[Item]:
    seen = total(change, "compaction_proxy_decisions_total")
    compacted = _compacted(change)["compacted"]
    by_route = summed(change, "compaction_proxy_decisions_total", "route")
    return [
        Item("seen", "requests compaction saw", seen),
        *(Item(f"seen_{route}", f"seen: {route}", count) for route, count in sorted(by_route.items())),
        Item("compacted", "compacted", compacted),
        Item("compacted_share", "compacted / seen", share(compacted, seen), "share"),
    ]


def _tokens(change: Change) -> dict[str, float]:
    return {
        "before": total(change, "compaction_proxy_tokens_before_sum"),
        "after": total(change, "compaction_proxy_tokens_after_sum"),
    }


def _token_items(change: Change) -> list[Item]:
    tokens = _tokens(change)
    removed = tokens["before"] - tokens["after"]
    return [
        Item("compactions", "compactions", total(change, "compaction_proxy_tokens_before_count")),
        Item("before", "tokens before", tokens["before"]),
        Item("after", "tokens after", tokens["after"]),
        Item("removed_share", "removed / before", share(removed, tokens["before"]), "share"),
    ]


def _offload(change: Change) -> dict[str, float]:
    reads = summed(change, "compaction_proxy_offload_reads_total", "result")
    return {"offloaded": total(change, "compaction_proxy_offloaded_results_total")} | {
        f"read {result}": count for result, count in reads.items()
    }


def _offload_items(change: Change) -> list[Item]:
    offloaded = total(change, "compaction_proxy_offloaded_results_total")
    served = total(change, "compaction_proxy_offload_reads_total", result="served")
    return [
        Item("offloaded", "results offloaded", offloaded),
        Item("served", "reads served", served),
        Item("not_held", "reads not held", total(change, "compaction_proxy_offload_reads_total", result="not_held")),
        Item("read_back_share", "reads served / offloaded", share(served, offloaded), "share"),
    ]


def _cached(change: Change) -> dict[str, float | None]:
    cached = total(change, "compaction_proxy_cached_prompt_tokens_total")
    return {"cached share": share(cached, total(change, "compaction_proxy_prompt_tokens_total"))}


def _cached_items(change: Change) -> list[Item]:
    prompt = total(change, "compaction_proxy_prompt_tokens_total")
    cached = total(change, "compaction_proxy_cached_prompt_tokens_total")
    return [
        Item("prompt", "prompt tokens reported", prompt),
        Item("cached", "cached prompt tokens", cached),
        Item("cached_share", "cached / prompt", share(cached, prompt), "share"),
    ]


def _window_items(change: Change) -> list[Item]:
    sources = summed(change, "compaction_proxy_window_sources_total", "source")
    known = sum(sources.values())
    learned, discovered = sources.get("learned", 0.0), sources.get("discovered", 0.0)
    return [
        Item("known", "requests with a known window", known),
        Item("learned", "learned from an overflow", learned),
        Item("discovered", "discovered from the upstream", discovered),
        Item(
            "learned_or_discovered_share", "(learned + discovered) / known", share(learned + discovered, known), "share"
        ),
    ]


_ERROR: Final = "compaction_proxy_estimate_error_ratio"
CLOSE: Final = 0.05
"""An estimate within this share of the reported count either way is close."""


def buckets(change: Change, name: str) -> list[tuple[float, float]]:
    """A histogram's cumulative buckets as (upper bound, count), lowest first (`+Inf` last)."""
    by_bound = summed(change, name + "_bucket", "le")
    return sorted((float(bound), count) for bound, count in by_bound.items())


def quantile(q: float, cumulative: list[tuple[float, float]]) -> float | None:
    """The `q` quantile, interpolated linearly within its bucket as Prometheus' `histogram_quantile` does."""
    if not cumulative or not cumulative[-1][1]:
        return None
    rank = q * cumulative[-1][1]
    lower, below = 0.0, 0.0
    for index, (bound, count) in enumerate(cumulative):
        if count >= rank:
            if bound == float("inf"):
                return lower
            if index == 0 and bound <= 0:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def _close(cumulative: list[tuple[float, float]]) -> float | None:
    """The share of estimates within `CLOSE` either way (the histogram has buckets at both bounds)."""
    found = dict(cumulative)
    checked = cumulative[-1][1] if cumulative else 0.0
    return share(found.get(CLOSE, 0.0) - found.get(-CLOSE, 0.0), checked)


def _estimate(change: Change) -> dict[str, float | None]:
    cumulative = buckets(change, _ERROR)
    return {"p10": quantile(0.1, cumulative), "median": quantile(0.5, cumulative), "p90": quantile(0.9, cumulative)}


def _estimate_items(change: Change) -> list[Item]:
    cumulative = buckets(change, _ERROR)
    return [
        Item("checked", "estimates checked", cumulative[-1][1] if cumulative else 0.0),
        Item("close_share", "within 5% / checked", _close(cumulative), SHARE),
        Item("median_error", "median error", quantile(0.5, cumulative), "ratio"),
        Item("p90_error", "90th percentile", quantile(0.9, cumulative), "ratio"),
    ]


def _fail_open_items(change: Change) -> list[Item]:
    failed = total(change, "compaction_proxy_fail_open_total")
    seen = total(change, "compaction_proxy_decisions_total")
    return [
        Item("fail_open", "forwarded unchanged after a failure", failed),
        Item("fail_open_share", "fail-opens / requests compaction saw", share(failed, seen), "share"),
    ]


def _totals(series: Callable[[Change], Mapping[str, float]]) -> Callable[[Change], list[Item]]:
    """Headline items: each series' total over the window."""
    return lambda change: [Item(name, name, value) for name, value in sorted(series(change).items())]


FIGURES: Final = (
    Figure(
        "requests",
        "Requests by API",
        "requests per minute",
        "Nothing: requests answered, by route kind (the proxy's own endpoints left out).",
        ("compaction_proxy_requests_total",),
        lambda change: _counts(_requests(change)),
        _totals(_requests),
    ),
    Figure(
        "decisions",
        "What compaction did, by API",
        "requests per minute",
        "Compacted share: compacted requests / requests the compaction side saw (chat completions, responses and the"
        " Messages API).",
        ("compaction_proxy_decisions_total",),
        lambda change: _counts(_decisions(change)),
        _decision_items,
    ),
    Figure(
        "strategies",
        "Compactions by strategy",
        "compactions per minute",
        "Nothing: compactions each strategy took part in (one compaction may use several).",
        ("compaction_proxy_compactions_total",),
        lambda change: _counts(summed(change, "compaction_proxy_compactions_total", "strategy")),
        _totals(lambda change: summed(change, "compaction_proxy_compactions_total", "strategy")),
    ),
    Figure(
        "tokens",
        "Tokens before and after compaction",
        "estimated tokens per minute, summed over compactions",
        "Removed share: (tokens before - tokens after) / tokens before, summed over the compactions in the window.",
        ("compaction_proxy_tokens_before", "compaction_proxy_tokens_after"),
        lambda change: _counts(_tokens(change)),
        _token_items,
    ),
    Figure(
        "offload",
        "Offloaded and read back",
        "results per minute",
        "Read-back share: reads the proxy served / tool results offloaded to the state store.",
        ("compaction_proxy_offloaded_results_total", "compaction_proxy_offload_reads_total"),
        lambda change: _counts(_offload(change)),
        _offload_items,
    ),
    Figure(
        "cache",
        "Cached share of prompt tokens",
        "share per minute",
        "Cached prompt tokens / prompt tokens, both as the upstream reported them in its usage.",
        ("compaction_proxy_cached_prompt_tokens_total", "compaction_proxy_prompt_tokens_total"),
        _cached,
        _cached_items,
        "share",
    ),
    Figure(
        "windows",
        "Where context windows came from",
        "requests per minute",
        "Learned or discovered share: requests whose window was learned or discovered / requests with a known window.",
        ("compaction_proxy_window_sources_total",),
        lambda change: _counts(summed(change, "compaction_proxy_window_sources_total", "source")),
        _window_items,
    ),
    Figure(
        "estimate",
        "Estimate error",
        "(estimated - reported) / reported prompt tokens: 10th percentile, median, 90th percentile per minute",
        "Within 5%: estimates off by at most 5% either way / estimates a usage report checked. The median and 90th"
        " percentile are interpolated within the histogram's buckets, as Prometheus' histogram_quantile does.",
        (_ERROR + "_bucket",),
        _estimate,
        _estimate_items,
        "ratio",
    ),
    Figure(
        "fail_open",
        "Fail-opens",
        "requests per minute",
        "Fail-open share: requests forwarded unchanged because the compaction side failed / requests it saw.",
        ("compaction_proxy_fail_open_total",),
        lambda change: _counts(summed(change, "compaction_proxy_fail_open_total", "stage")),
        _fail_open_items,
    ),
)
"""The dashboard's figures, in the order the page shows them."""


FAMILIES: Final = frozenset(
    re.sub(r"_(total|bucket|sum|count)$", "", metric) for figure in FIGURES for metric in figure.metrics
)
"""The metric families the figures read: all the ring keeps."""


def dashboard_json(window: Window, step_seconds: float, window_seconds: float) -> dict[str, Any]:
    """The dashboard's data: the minutes' end times (Unix seconds) and every figure over them."""
    return {
        "step_seconds": step_seconds,
        "window_seconds": window_seconds,
        "ends": window.ends,
        "figures": [figure.to_json(window) for figure in FIGURES],
    }
