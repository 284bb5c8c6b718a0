"""A line logged with `log_fields` is written as `Logger.log` would have written it, in the order lines were logged.

The serving process's handler (`configure_logging(deferred=True)`) keeps such a line as it was logged and makes its
record when it writes it; the line must come out the same, in either format, with the request id and worker it was
logged with.
"""

from __future__ import annotations

import asyncio
import io
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config import LogFormat, Settings
from proxy.server.logging import (
    ACCESS_LOGGER,
    REQUEST_ID,
    JsonFormatter,
    _Batched,
    _Line,
    _WorkerField,
    configure_logging,
    flush_logging,
    log_fields,
)
from tests.support.examples import examples

field_values = st.none() | st.booleans() | st.integers(-(10**9), 10**9) | st.text(max_size=10)
fields_of_a_line = st.dictionaries(st.sampled_from(["method", "path", "status", "model", "error", "x"]), field_values)


@contextmanager
def serving_logs(log_format: LogFormat, worker: int | None) -> Iterator[io.StringIO]:
    """Logging as a serving process sets it up, written to the returned buffer; restored afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    with redirect_stderr(stream):
        configure_logging(Settings(upstream="http://127.0.0.1:1", log_format=log_format), worker, deferred=True)
    try:
        yield stream
    finally:
        flush_logging()
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)


def without_time(line: str) -> str:
    """The line without its time stamp (the two ways of logging take it a moment apart)."""
    return re.sub(r'^\{"time":"[^"]*",|^\S+ ', "", line)


@pytest.mark.parametrize("log_format", list(LogFormat))
@settings(max_examples=examples(50))
@given(fields=fields_of_a_line, request_id=st.none() | st.text("0123456789abcdef", min_size=16, max_size=16))
def test_a_deferred_line_reads_as_the_logged_one(
    log_format: LogFormat, fields: dict[str, Any], request_id: str | None
) -> None:
    logger = logging.getLogger(ACCESS_LOGGER)

    async def log_both() -> None:
        named = REQUEST_ID.set(request_id)
        try:
            logger.info("request", extra={"fields": dict(fields)})
            log_fields(logger, logging.INFO, "request", dict(fields))
        finally:
            REQUEST_ID.reset(named)

    with serving_logs(log_format, worker=3) as stream:
        asyncio.run(log_both())
        flush_logging()
    logged, deferred = stream.getvalue().splitlines()
    assert without_time(deferred) == without_time(logged)
    if log_format is LogFormat.JSON:
        assert orjson.loads(deferred)["worker"] == 3


def test_lines_keep_the_order_they_were_logged_in() -> None:
    logger = logging.getLogger(ACCESS_LOGGER)

    async def log_in_turns() -> None:
        for number in range(3):
            log_fields(logger, logging.INFO, "request", {"n": number})
            logger.info("other", extra={"fields": {"n": number}})
            await asyncio.sleep(0)

    with serving_logs(LogFormat.JSON, worker=None) as stream:
        asyncio.run(log_in_turns())
    lines = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["message"], line["n"]) for line in lines] == [
        (message, number) for number in range(3) for message in ("request", "other")
    ]


def test_a_line_below_the_level_is_not_written() -> None:
    logger = logging.getLogger(ACCESS_LOGGER)

    async def log_debug() -> None:
        log_fields(logger, logging.DEBUG, "request", {"n": 1})

    with serving_logs(LogFormat.JSON, worker=None) as stream:
        asyncio.run(log_debug())
    assert stream.getvalue() == ""


class _KeepAll(logging.Filter):
    """A filter of the operator's: the handler then renders each line from its record (the general path)."""


ids = st.none() | st.text("0123456789abcdef", min_size=16, max_size=16)
lines = st.builds(
    _Line,
    logger=st.just(ACCESS_LOGGER),
    level=st.sampled_from([logging.DEBUG, logging.INFO, logging.WARNING, 25]),
    message=st.text(max_size=20),
    fields=st.dictionaries(st.text(max_size=8), field_values | st.floats(allow_nan=False)),
    time_ns=st.integers(0, 4 * 10**18),
    request_id=ids,
)


@settings(max_examples=examples(200))
@given(line=lines, ambient=ids, workers=st.lists(st.integers(0, 64), max_size=2))
def test_a_line_rendered_straight_to_json_is_the_formatted_record(
    line: _Line, ambient: str | None, workers: list[int]
) -> None:
    handler = _Batched(io.StringIO())
    handler.setFormatter(JsonFormatter())
    for worker in workers:
        handler.addFilter(_WorkerField(worker))
    named = REQUEST_ID.set(ambient)
    try:
        only_workers = handler._workers_only()
        assert only_workers is not None
        straight = line.json(only_workers)
        record = line.record(handler)
        assert record is not None
        assert straight == handler.format(record)
        handler.addFilter(_KeepAll())
        assert handler._workers_only() is None  # another filter: the record is made, as `Logger.log` would
    finally:
        REQUEST_ID.reset(named)
