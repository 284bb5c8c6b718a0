"""Settings of the listening side: where the proxy listens, what it accepts from clients, how it stops and logs."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr, field_validator

from proxy.config.kinds import MIB, EventLoop, LogFormat, LogLevel, PositiveSeconds


class ClientSettings(BaseModel):
    """The address, the limits on what a client may send, the optional proxy keys, shutdown and logging."""

    host: str = Field(
        default="127.0.0.1",
        description=(
            "Interface the proxy listens on. Loopback by default: the proxy forwards its clients' credentials, so it"
            " answers other hosts only when asked to (`0.0.0.0`: every IPv4 interface, as the container image sets)."
        ),
    )
    port: int = Field(default=8080, ge=0, le=65535, description="TCP port the proxy listens on; 0 picks a free one.")
    max_body_bytes: int = Field(
        default=64 * MIB,
        gt=0,
        description="Largest request body accepted from a client, in bytes; larger ones get 413.",
    )
    max_gzip_members: int = Field(
        default=64,
        ge=1,
        description=(
            "Most gzip members a gzip-coded chat request body may hold (RFC 1952 lets members follow one another;"
            " gzip writers make one, concatenated files a few), and zstd frames a zstd-coded one; more get 400"
            " `too_many_gzip_members`. Each member costs a decoder of its own, so this bounds the work of a body of"
            " many tiny members."
        ),
    )
    client_body_timeout: PositiveSeconds = Field(
        default=60.0,
        description=(
            "Seconds a client may pause while sending its request body; a slower client gets 408 and its connection"
            " closed, so a trickling upload cannot hold a handler (and an upstream connection) open indefinitely."
        ),
    )
    client_body_min_rate: int = Field(
        default=500,
        gt=0,
        description=(
            "Slowest average rate, in bytes per second, at which a request body may arrive once its first"
            " `client_body_timeout` seconds are over: a body of N bytes must be complete within"
            " `client_body_timeout` + N / this seconds of its head (Apache's mod_reqtimeout MinRate), else 408 and"
            " the connection closed. A client trickling a byte now and then never pauses long enough for"
            " `client_body_timeout` alone; this stops it. 500 B/s is Apache's default: far below any real uplink."
        ),
    )
    client_header_timeout: PositiveSeconds = Field(
        default=75.0,
        description=(
            "Seconds a client connection may go without a complete request head, counted from when it opens and"
            " again from the end of each response: a connection that sends nothing, sends its head too slowly, or"
            " idles between requests (keep-alive) that long is closed. 75 s (nginx's keep-alive default) outlasts"
            " the 60 s idle timeout of common load balancers, so one in front never reuses a connection the proxy"
            " has just closed."
        ),
    )
    max_connections: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Most client connections open at once. At the cap, a new connection makes room by closing the one that"
            " has been idle (no request in progress) longest; when none is idle, the new one is closed. None (the"
            " default): derived from the process's open-file limit (RLIMIT_NOFILE), leaving room for one upstream"
            " connection per client connection and for the proxy's own files, so the proxy never runs out of file"
            " descriptors. Applies to `compaction-proxy serve`."
        ),
    )
    max_websockets: int = Field(
        default=1024,
        ge=0,
        description=(
            "Most WebSockets tunnelled at once, and never more than half of `max_connections`: a socket is a"
            " request in progress for as long as it is open (pings keep it open past `idle_timeout`), so the"
            " connection cap never closes it to make room; this keeps the other half of the connections for HTTP,"
            " so `/healthz`, `/readyz` and HTTP clients always get in. An upgrade past it is answered 503"
            " `too_many_websockets` (not forwarded); a socket's slot is free again once it closed. 0: no sockets."
        ),
    )
    max_header_bytes: int = Field(
        default=8190,
        ge=1024,
        description=(
            "Longest request line and longest single header (name and value) accepted from a client, in bytes;"
            " longer ones are refused with 400 before any handler runs."
        ),
    )
    max_headers: int = Field(
        default=128, ge=8, description="Most request headers accepted from a client; more are refused with 400."
    )
    proxy_keys: list[SecretStr] = Field(
        default_factory=list,
        description=(
            "Inbound authentication for a shared gateway: when not empty, every forwarded request must carry one of"
            " these secrets in `X-Proxy-Key: <key>` or `Proxy-Authorization: Bearer <key>` (else 401); the header is"
            " removed before forwarding. `/healthz`, `/readyz` and `/metrics` stay open (the dashboard does not)."
            " Each key at least 16 characters. Empty (the default): off. From the environment: a JSON list or"
            " comma-separated keys."
            " Never logged."
        ),
    )
    dashboard: bool = Field(
        default=False,
        description=(
            "Serve a dashboard of the last hour at `/dashboard` (a page with no outside resources) and its data at"
            " `/dashboard.json`: requests and compactions by API and strategy, tokens before and after, offloading,"
            " cached prompt tokens, window sources, estimate error, fail-opens; figures only, never message content."
            " Behind `proxy_keys` when they are set (a browser may give the key as the password of its login prompt)."
            " Off (the default): those paths answer 404."
        ),
    )
    workers: int = Field(
        default=1,
        ge=1,
        description=(
            "Processes serving the port, each a full proxy (the kernel spreads connections over them with"
            " SO_REUSEPORT), to use more than one core. More than 1 needs a shared state_url (Redis): state kept in"
            " each process's memory would split a conversation's state between them. `/metrics` is per process."
            " Applies to `compaction-proxy serve`."
        ),
    )
    shutdown_grace_seconds: float = Field(
        default=30.0,
        ge=0,
        description="On SIGTERM: stop accepting, then give in-flight requests and streams this long to finish.",
    )
    log_level: LogLevel = Field(default=LogLevel.INFO, description="Minimum severity logged.")
    log_format: LogFormat = Field(default=LogFormat.JSON, description="`json` (one object per line) or `text`.")
    event_loop: EventLoop = Field(
        default=EventLoop.AUTO,
        description=(
            "The event loop `compaction-proxy serve` runs on: `auto` is uvloop when installed (the `speed` extra,"
            " which the container image has: less CPU per request), else asyncio's; `asyncio` or `uvloop` to choose."
        ),
    )

    @field_validator("proxy_keys")
    @classmethod
    def _check_proxy_keys(cls, value: list[SecretStr]) -> list[SecretStr]:
        for key in value:
            secret = key.get_secret_value()
            if len(secret) < 16:
                raise ValueError("each proxy key must be at least 16 characters")
            if secret != secret.strip() or any(not 0x21 <= ord(char) <= 0x7E for char in secret):
                raise ValueError("proxy keys must be printable ASCII without spaces (they travel in a header)")
        return value
