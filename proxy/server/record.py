"""What one request did, filled in by the handlers and written out once by the access-log middleware."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    """Facts about one request: no bodies and no header values other than the conversation id and the model.

    `request_id` is new per request and names it in every line logged while it is handled (`REQUEST_ID`).

    :param method: HTTP method.
    :param route: Route kind (bounded label).
    :param conversation_id: Value of the configured conversation header, else of one its format's clients send
        (`WireFormat.conversation_headers`), if present (truncated).
    """

    method: str
    route: str
    conversation_id: str | None = None
    request_id: str = field(default_factory=lambda: secrets.token_hex(8))
    model: str | None = None
    compaction: str | None = None
    """What compaction did (the `X-Compaction` value sent back)."""
    tokens_before: int | None = None
    tokens_after: int | None = None
    started: float = field(default_factory=time.perf_counter)
    status: int | None = None
    upstream_status: int | None = None
    upstream_latency: float | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    fail_open: list[str] = field(default_factory=list)
    retried: bool = False
    stripped_usage: bool = False
    client_disconnected: bool = False
    error: str | None = None

    def elapsed(self) -> float:
        """Seconds since the request arrived."""
        return time.perf_counter() - self.started
