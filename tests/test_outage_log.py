"""An outage is one WARNING when it starts and one INFO when it ends, however many requests meet it."""

from __future__ import annotations

import logging

from hypothesis import given
from hypothesis import strategies as st

from proxy.failures import OutageLog


@given(events=st.lists(st.sampled_from(["outage", "bug", "answered"]), max_size=40))
def test_one_warning_per_outage_and_a_stack_per_bug(events: list[str]) -> None:
    logger = logging.getLogger("tests.outage")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        log = OutageLog(logger, (ConnectionError,), "The state store")
        for event in events:
            if event == "answered":
                log.answered()
            else:
                log.failed("Compaction failed.", ConnectionError() if event == "outage" else KeyError())
    finally:
        logger.removeHandler(handler)

    assert sum(record.levelno == logging.WARNING for record in records) == _outages(events)
    assert sum(record.levelno == logging.INFO for record in records) == _recoveries(events)
    assert sum(record.levelno == logging.ERROR for record in records) == events.count("bug")


def _outages(events: list[str]) -> int:
    """How many times the store went from answering to not answering."""
    down, count = False, 0
    for event in events:
        if event == "outage" and not down:
            down, count = True, count + 1
        elif event == "answered":
            down = False
    return count


def _recoveries(events: list[str]) -> int:
    """How many times the store answered again after an outage."""
    down, count = False, 0
    for event in events:
        if event == "outage":
            down = True
        elif event == "answered" and down:
            down, count = False, count + 1
    return count
