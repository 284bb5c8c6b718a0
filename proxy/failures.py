"""Logging a failure of our own without its message: an exception's text may quote a request body or a header."""

from __future__ import annotations

import logging
import traceback
from typing import Any


def log_failure(logger: logging.Logger, message: str, error: BaseException, **fields: Any) -> None:
    """Log `message` with the exception's type and stack, never its text (structured `fields` go along)."""
    stack = "".join(traceback.format_tb(error.__traceback__)).rstrip()
    logger.error(message, extra={"fields": {**fields, "error": type(error).__name__, "stack": stack}})
