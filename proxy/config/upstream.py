"""Settings of the one place the proxy forwards to: the provider's URL and how long it may take to answer."""

from __future__ import annotations

import ssl
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator

from proxy.config.kinds import CABundle, PositiveSeconds


class UpstreamSettings(BaseModel):
    """The provider's base URL and the timeouts of every exchange with it."""

    upstream: str = Field(
        default="https://api.openai.com",
        description=(
            "Base URL of the real provider (scheme, host, optional port and base path). Every request is forwarded to"
            " this origin, never elsewhere: a request path `/v1/models` goes to `<upstream>/v1/models`, and a base"
            " path such as `https://api.groq.com/openai` is prepended. No query string or fragment."
        ),
    )
    upstream_ca_bundle: CABundle | None = Field(
        default=None,
        description=(
            "PEM file of CA certificates trusted for TLS to the upstream (and the summary calls, which go there too)"
            " in addition to the system's default trust, for an upstream or TLS-inspecting proxy behind a private CA."
            " Unlike SSL_CERT_FILE, which replaces the default bundle, public CAs stay trusted."
        ),
    )
    connect_timeout: PositiveSeconds = Field(
        default=10.0, description="Seconds to open a connection to the upstream (TCP and TLS) before answering 504."
    )
    first_byte_timeout: PositiveSeconds = Field(
        default=600.0,
        description=(
            "Seconds from sending a request to the upstream's response headers. A non-streamed completion only"
            " answers when fully generated, so this must cover the slowest generation."
        ),
    )
    idle_timeout: PositiveSeconds = Field(
        default=300.0,
        description="Seconds the upstream may stay silent while sending a response body (e.g. between SSE events).",
    )

    @field_validator("upstream")
    @classmethod
    def _check_upstream(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        if parts.query or parts.fragment:
            raise ValueError("must not have a query string or fragment")
        if parts.username or parts.password:
            raise ValueError("must not embed credentials")
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as exc:
            raise ValueError(str(exc)) from None
        base = value.strip().rstrip("/")
        if base.lower().endswith("/v1"):
            # Clients already put /v1 in every path (their base URL is the proxy's plus /v1): it would be sent twice.
            raise ValueError(
                f"must not end in /v1, which clients already send in every path (/v1/v1/... would get 404): pass"
                f" {base[:-3]}"
            )
        return base

    def upstream_ssl(self) -> ssl.SSLContext | bool:
        """The TLS verification for connections to the upstream, as aiohttp's `ssl` argument.

        True (aiohttp's default verification) without `upstream_ca_bundle`; with it, a verifying context that loads
        the default trust and then the bundle, so the bundle's CAs are added rather than substituted.
        """
        if self.upstream_ca_bundle is None:
            return True
        context = ssl.create_default_context()
        context.load_verify_locations(cafile=self.upstream_ca_bundle)
        return context
