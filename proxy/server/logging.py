"""Structured logs: one JSON object per line (or `key=value` text), on stderr.

Log calls pass their fields as `extra={"fields": {...}}`; the formatters add them to the line. Nothing here ever
receives a body or a credential: the access log records method, route kind, status, latency, byte counts and the
conversation id header, and nothing else from the request.

How a line reads (JSON or text, exceptions by type and stack only) is `proxy.server.log_formats`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import logging
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
from aiohttp.http import HttpProcessingError

from proxy.config import LogFormat, Settings
from proxy.server.log_formats import REQUEST_ID, JsonFormatter, TextFormatter, json_head

ACCESS_LOGGER: Final = "compaction_proxy.access"
SERVER_LOGGER: Final = "compaction_proxy.server"
CONNECTION_LOGGER: Final = "compaction_proxy.connections"
"""The logger the proxy gives aiohttp's connection handlers (wrapped in `ConnectionLogger`), in place of aiohttp's
own `aiohttp.server`, so every line the proxy writes names a `compaction_proxy.*` logger."""


class ConnectionLogger(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's connection-handler logger, with a malformed client request logged as one INFO line.

    aiohttp logs every request head it cannot parse (a bad request line or header, one too long, too many) with
    `logger.exception`: an ERROR and a traceback per request, as many as a client cares to send, for what is the
    client's fault. Those become one INFO line with the status answered and the kind of error, nothing of the
    request's bytes. Anything else (an exception a handler left unhandled: the proxy's fault) is logged as before.
    """

    def exception(
        self,
        msg: object,
        *args: object,
        exc_info: Any = True,
        stack_info: bool = False,
        stacklevel: int = 1,
        extra: Mapping[str, object] | None = None,
        **kwargs: object,
    ) -> None:
        """Log a malformed request (an `HttpProcessingError`) at INFO without a traceback; the rest as aiohttp does."""
        if isinstance(exc_info, HttpProcessingError):
            self.logger.info(
                "malformed request refused",
                extra={"fields": {"status": exc_info.code, "error": type(exc_info).__name__}},
            )
            return
        self.logger.exception(
            msg, *args, exc_info=exc_info, stack_info=stack_info, stacklevel=stacklevel, extra=extra, **kwargs
        )


class _WorkerField(logging.Filter):
    """Adds the worker's number to every record, so the lines of several workers on one stderr can be told apart."""

    def __init__(self, worker: int) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        """Set `record.worker`; never drops a record."""
        record.worker = self.worker
        return True


class _Batched(logging.StreamHandler):  # type: ignore[type-arg]
    """Lines logged on the event loop are formatted and written after the loop's turn, all of a turn's in one write.

    A request's access line then costs its handler a list append (logged with `log_fields`, not even a record: that
    is made when the line is written, and only if it must be: a JSON line is rendered straight from the kept line,
    `_Line.json`); the formatting and the write happen after the handler returned, once per turn
    of the loop for every line logged in it. What a line takes from the moment it is
    logged is taken then: its time (the record's) and the request it names (`REQUEST_ID`). A line logged off the
    loop (a worker thread, startup, shutdown) is written at once, after the lines waiting before it, so the order of
    the lines is the order they were logged in.
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._pending: list[logging.LogRecord | _Line] = []

    def keep(self, line: logging.LogRecord | _Line, loop: asyncio.AbstractEventLoop) -> None:
        """Keep a line for the end of the loop's turn: a record, or a line whose record is made then (`log_fields`)."""
        self._pending.append(line)
        if len(self._pending) == 1:
            loop.call_soon(self.flush, context=contextvars.Context())  # formatted outside any request's context

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record for the end of the loop's turn (write it now when not on a loop)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write_pending()
            super().emit(record)
            return
        request_id = REQUEST_ID.get()
        if request_id is not None and not hasattr(record, "request_id"):
            record.request_id = request_id
        self.keep(record, loop)

    def flush(self) -> None:
        """Write the lines waiting, in one write."""
        self.acquire()
        try:
            self._write_pending()
            super().flush()
        finally:
            self.release()

    def _write_pending(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        workers = self._workers_only()
        try:
            lines = [line for line in (self._rendered(item, workers) for item in pending) if line is not None]
            if lines:
                self.stream.write(self.terminator.join(lines) + self.terminator)
        except Exception:
            first = pending[0]
            self.handleError(first if isinstance(first, logging.LogRecord) else first.log_record())

    def _workers_only(self) -> list[_WorkerField] | None:
        """The handler's filters, when it writes JSON and its only filters add the worker; else None.

        A `_Line` is then rendered straight to its JSON (`_Line.json`), without a record: what `JsonFormatter` makes
        of its record, for a fraction of the cost (the access line is one per request).
        """
        if type(self.formatter) is not JsonFormatter:
            return None
        filters = self.filters
        return filters if all(type(found) is _WorkerField for found in filters) else None  # type: ignore[return-value]

    def _rendered(self, item: logging.LogRecord | _Line, workers: list[_WorkerField] | None) -> str | None:
        """The text of one kept line; None when the handler's filters drop it."""
        if isinstance(item, _Line):
            if workers is not None:
                return item.json(workers)
            made = item.record(self)
            return None if made is None else self.format(made)
        return self.format(item)


@dataclass(slots=True)
class _Line:
    """A line logged with `log_fields`, kept as it was logged until it is written."""

    logger: str
    level: int
    message: str
    fields: dict[str, Any]
    time_ns: int
    request_id: str | None

    def log_record(self) -> logging.LogRecord:
        """The record `Logger.log` would have made of the line, before any handler's filters."""
        record = logging.LogRecord(self.logger, self.level, "(unknown file)", 0, self.message, None, None)
        record.created, record.msecs = _created(self.time_ns)
        record.fields = self.fields
        return record

    def record(self, handler: logging.Handler) -> logging.LogRecord | None:
        """The record the line would have had, had it been logged with `Logger.log` to `handler`.

        None when the handler's filters drop it.
        """
        record = self.log_record()
        if not handler.filter(record):
            return None
        if self.request_id is not None:  # after the filters, as `_Batched.emit` adds it
            record.request_id = self.request_id
        return record

    def json(self, workers: list[_WorkerField]) -> str:
        """`JsonFormatter().format(self.record(handler))` for a handler whose only filters are `workers`.

        The keys come in the record's order: the head, the request being handled where the line is written (none,
        on the loop's own turn), the worker, the request the line was logged in, then the line's fields.
        """
        created, msecs = _created(self.time_ns)
        line = json_head(created, msecs, logging.getLevelName(self.level), self.logger, self.message)
        ambient = REQUEST_ID.get()
        if ambient is not None:
            line["request_id"] = ambient
        for added in workers:
            line["worker"] = added.worker
        if self.request_id is not None:
            line["request_id"] = self.request_id
        line.update(self.fields)
        return orjson.dumps(line, default=str).decode()


def _created(time_ns: int) -> tuple[float, float]:
    """A record's `created` and `msecs` for a moment (nanoseconds since the epoch), as `logging.LogRecord` sets them."""
    return time_ns / 1e9, (time_ns % 1_000_000_000) // 1_000_000 + 0.0


def log_fields(logger: logging.Logger, level: int, message: str, fields: dict[str, Any]) -> None:
    """`logger.log(level, message, extra={"fields": fields})`, for lines logged once per request (the access line).

    In a serving process the line's only way out is the handler that writes after the loop's turn (`_Batched`):
    then no record is made and no handler called now; the line is kept as it is and its record made when it is
    written, as `Logger.log` would have made it. Anywhere else (another handler or filter on the way: a test's
    capture, an operator's set-up) the line is logged as usual.
    """
    if not logger.isEnabledFor(level):
        return
    sink = _only_sink(logger, level)
    if sink is None:
        logger.log(level, message, extra={"fields": fields})
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        logger.log(level, message, extra={"fields": fields})
        return
    sink.keep(_Line(logger.name, level, message, fields, time.time_ns(), REQUEST_ID.get()), loop)


def _only_sink(logger: logging.Logger, level: int) -> _Batched | None:
    """The deferred handler, when it is the one handler a line of `level` from `logger` reaches; else None.

    None too when the logger has filters of its own; the handler's filters are applied when the line is written.
    """
    if logger.filters or logger.disabled:
        return None
    found: _Batched | None = None
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if found is not None or not isinstance(handler, _Batched):
                return None
            found = handler
        if not current.propagate:
            break
        current = current.parent
    return found if found is not None and level >= found.level else None


def flush_logging() -> None:
    """Write every line logged so far (they may wait for the end of the loop's turn, see `configure_logging`).

    Called when the proxy stops (and at exit): its last lines (access lines of the last requests, `stopped`) are all
    written, in order, before the process ends, even if its loop closed before the turn that would have written them.
    """
    for handler in logging.getLogger().handlers:
        handler.flush()


atexit.register(flush_logging)


def configure_logging(settings: Settings, worker: int | None = None, *, deferred: bool = False) -> None:
    """Send all logging (the proxy's, aiohttp's, the compaction side's) to stderr in the configured format.

    :param worker: The worker this process is (`workers` > 1): every line then carries it as `worker`.
    :param deferred: Format and write the lines logged on the event loop after its turn, a turn's lines in one write
        (a serving process: see `_Batched`); `flush_logging` writes what is left.
    """
    flush_logging()
    # The records' thread, process and caller are in no line: not looking them up makes each line cheaper (the
    # logging HOWTO's "Optimization"), which counts on the access log's one line per request.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None
    handler = _Batched(sys.stderr) if deferred else logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if settings.log_format is LogFormat.JSON else TextFormatter())
    if worker is not None:
        handler.addFilter(_WorkerField(worker))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(settings.log_level.value.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
