"""Settings of the listening side: where the proxy listens, what it accepts from clients, how it stops and logs."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr, field_validator

from proxy.config.kinds import MIB, LogFormat, LogLevel, PositiveSeconds


class ClientSettings(BaseModel):
    """The address, the limits on what a client may send, the optional proxy keys, shutdown and logging."""

    host: str = Field(default="0.0.0.0", description="Interface the proxy listens on (`0.0.0.0`: all IPv4).")
    port: int = Field(default=8080, ge=0, le=65535, description="TCP port the proxy listens on; 0 picks a free one.")
    max_body_bytes: int = Field(
        default=64 * MIB,
        gt=0,
        description="Largest request body accepted from a client, in bytes; larger ones get 413.",
    )
    client_body_timeout: PositiveSeconds = Field(
        default=60.0,
        description=(
            "Seconds a client may pause while sending its request body; a slower client gets 408 and its connection"
            " closed, so a trickling upload cannot hold a handler (and an upstream connection) open indefinitely."
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
            " removed before forwarding. `/healthz`, `/readyz` and `/metrics` stay open. Each key at least 16"
            " characters. Empty (the default): off. From the environment: a JSON list or comma-separated keys."
            " Never logged."
        ),
    )
    shutdown_grace_seconds: float = Field(
        default=30.0,
        ge=0,
        description="On SIGTERM: stop accepting, then give in-flight requests and streams this long to finish.",
    )
    log_level: LogLevel = Field(default=LogLevel.INFO, description="Minimum severity logged.")
    log_format: LogFormat = Field(default=LogFormat.JSON, description="`json` (one object per line) or `text`.")

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
