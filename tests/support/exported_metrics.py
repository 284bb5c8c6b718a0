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


def declared_names(exposition: str) -> set[str]:
    """Every family's name (a counter's also with `_total`), whether or not it has a series yet."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.add(family.name)
        if family.type == "counter":
            names.add(family.name + "_total")
    return names
