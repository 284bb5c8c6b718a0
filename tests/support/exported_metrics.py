"""The metric names a running proxy's `/metrics` holds: declared (a family, series or not) and with series."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sampled_names(exposition: str) -> set[str]:
    """Names with at least one series: `..._total`, `..._bucket`, `..._sum`, `..._count`, gauges, and their family."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        found = {sample.name for sample in family.samples}
        names.update(found)
        if found:
            names.add(family.name)
    return names


_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}


def declared_names(exposition: str) -> set[str]:
    """Every family's name and its samples' names (`_total`; `_bucket`, `_sum`, `_count`), series or not yet."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.add(family.name)
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ()))
    return names
