"""The enumerated settings: how the proxy acts on its decisions and how it logs."""

from __future__ import annotations

import ssl
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Final

from pydantic import AfterValidator, Field, FilePath

MIB: Final = 1024 * 1024

PositiveSeconds = Annotated[float, Field(gt=0)]


def _check_ca_bundle(path: Path) -> Path:
    """Load the file as TLS trust once, so a bundle that holds no PEM certificate stops the start-up, not a request."""
    try:
        ssl.create_default_context().load_verify_locations(cafile=path)
    except (ssl.SSLError, OSError):
        raise ValueError("must be a readable PEM file of CA certificates") from None
    return path


CABundle = Annotated[FilePath, AfterValidator(_check_ca_bundle)]
"""A PEM file of CA certificates to trust in addition to the default (system) trust."""


class Mode(StrEnum):
    """Whether the proxy acts on its compaction decisions."""

    ENFORCE = "enforce"
    """Rewrite oversized conversations before forwarding them."""
    OBSERVE = "observe"
    """Decide and report (metrics, logs) as in enforce mode, but forward every request unchanged."""


class ProviderState(StrEnum):
    """What the proxy asks of a provider keeping a Responses conversation's history, once it passes `compact_at`.

    With `previous_response_id` or `conversation` the history is at the provider, out of the proxy's reach.
    """

    OFF = "off"
    """Nothing: forward every request as sent."""
    COMPACTION = "compaction"
    """Ask the provider to compact on its side: `context_management` with `compact_threshold` at `compact_at` of the
    window (OpenAI's Responses API; an upstream without it rejects the field)."""
    TRUNCATION = "truncation"
    """Ask the provider to drop the oldest items itself: `truncation: auto`."""


class ClientCompaction(StrEnum):
    """What the proxy does for a client that compacts its conversation itself (`proxy.pipeline.client_compaction`)."""

    AUTO = "auto"
    """Defer to the client where it is recognized (its headers, its own compaction request or items, its context
    management): compact only as the safety net, when a request would not fit the window."""
    DEFER = "defer"
    """Defer to every client, recognized or not: the operator knows they all compact themselves."""
    IGNORE = "ignore"
    """Never defer: compact at `compact_at` whatever the client does."""


class LogFormat(StrEnum):
    """How log lines are written."""

    JSON = "json"
    """One JSON object per line, for log collectors."""
    TEXT = "text"
    """`time level logger message key=value ...`, for people reading a terminal."""


class EventLoop(StrEnum):
    """The event loop `compaction-proxy serve` runs on."""

    AUTO = "auto"
    """uvloop when it is installed (the `speed` extra), else asyncio's own."""
    ASYNCIO = "asyncio"
    """asyncio's own loop."""
    UVLOOP = "uvloop"
    """uvloop; the proxy refuses to start without it."""


class LogLevel(StrEnum):
    """The minimum severity that is logged."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"
