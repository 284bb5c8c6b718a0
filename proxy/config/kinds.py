"""The enumerated settings: how the proxy acts on its decisions and how it logs."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Final

from pydantic import Field

MIB: Final = 1024 * 1024

PositiveSeconds = Annotated[float, Field(gt=0)]


class Mode(StrEnum):
    """Whether the proxy acts on its compaction decisions."""

    ENFORCE = "enforce"
    """Rewrite oversized conversations before forwarding them."""
    OBSERVE = "observe"
    """Decide and report (metrics, logs) as in enforce mode, but forward every request unchanged."""


class LogFormat(StrEnum):
    """How log lines are written."""

    JSON = "json"
    """One JSON object per line, for log collectors."""
    TEXT = "text"
    """`time level logger message key=value ...`, for people reading a terminal."""


class LogLevel(StrEnum):
    """The minimum severity that is logged."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    CRITICAL = "critical"
