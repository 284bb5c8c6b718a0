"""A metric's child for some label values, looked up once: `labels()` costs more than the increment it serves.

prometheus_client's `labels()` checks its arguments, takes the metric's lock and looks the child up, each time; the
proxy counts a handful of labelled series per request, on values from small fixed sets (route kinds, statuses, route
names, decisions). The children are cached here by metric and values, so a request pays a dict lookup for each.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TypeVar

from prometheus_client.metrics import MetricWrapperBase

Metric = TypeVar("Metric", bound=MetricWrapperBase)

CACHED_CHILDREN = 4096
"""Children kept; more distinct (metric, values) pairs than this are looked up again (correct, only slower)."""


@lru_cache(maxsize=CACHED_CHILDREN)
def labelled(metric: Metric, *values: str) -> Metric:
    """`metric.labels(*values)`: the child for these label values, in the order the metric names its labels."""
    return metric.labels(*values)
