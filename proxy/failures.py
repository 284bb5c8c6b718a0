"""Logging a failure of our own without its message: an exception's text may quote a request body or a header.

A bug gets its stack at ERROR; a dependency that stops answering (the state store) is one WARNING when it stops and
one INFO when it answers again, however many requests meet it in between: an outage must not write a stack per
request.
"""

from __future__ import annotations

import logging
import traceback
from typing import Any


def log_failure(logger: logging.Logger, message: str, error: BaseException, **fields: Any) -> None:
    """Log `message` with the exception's type and stack, never its text (structured `fields` go along)."""
    stack = "".join(traceback.format_tb(error.__traceback__)).rstrip()
    logger.error(message, extra={"fields": {**fields, "error": type(error).__name__, "stack": stack}})


class OutageLog:
    """Failures logged as bugs, except a dependency's outage: one WARNING when it starts, one INFO when it ends.

    :param logger: Where the lines go.
    :param outage: The exception types that mean the dependency does not answer (a refused connection, a timeout).
    :param dependency: What does not answer, as a sentence names it ("The state store").
    """

    def __init__(self, logger: logging.Logger, outage: tuple[type[BaseException], ...], dependency: str) -> None:
        self.logger = logger
        self.outage = outage
        self.dependency = dependency
        self.down = False

    def failed(self, message: str, error: BaseException) -> None:
        """Log a failure: `message` with its stack, or the start of an outage once."""
        if not isinstance(error, self.outage):
            log_failure(self.logger, message, error)
            return
        if not self.down:
            self.down = True
            self.logger.warning(
                f"{self.dependency} does not answer; requests are forwarded unchanged until it does. Check that it "
                "runs and is reachable from the proxy.",
                extra={"fields": {"error": type(error).__name__}},
            )

    def answered(self) -> None:
        """The dependency answered: an outage, if any, is over (one INFO line)."""
        if self.down:
            self.down = False
            self.logger.info(f"{self.dependency} answers again; compaction resumes.")
