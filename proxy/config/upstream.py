"""Settings of the places the proxy forwards to: the providers' URLs, the routes to them, how long they may take."""

from __future__ import annotations

import ssl

from pydantic import BaseModel, Field, field_validator

from proxy.config.kinds import CABundle, PositiveSeconds
from proxy.config.routes import (
    ANTHROPIC_ORIGIN,
    ANTHROPIC_ROUTE,
    DEFAULT_ROUTE,
    OPENAI_ORIGIN,
    RouteSettings,
    check_origin,
)


class UpstreamSettings(BaseModel):
    """The provider's base URL and the timeouts of every exchange with it."""

    upstream: str = Field(
        default=OPENAI_ORIGIN,
        description=(
            "Base URL of the real provider (scheme, host, optional port and base path). Every request no route takes"
            " is forwarded to this origin, never elsewhere: a request path `/v1/models` goes to"
            " `<upstream>/v1/models`, and a base path such as `https://api.groq.com/openai` is prepended. No query"
            " string or fragment."
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

    anthropic_upstream: str | None = Field(
        default=None,
        description=(
            "Base URL the Messages API goes to (`/v1/messages`, and any request with `anthropic-version`: Claude"
            " Code's `ANTHROPIC_BASE_URL` traffic). Unset: Anthropic's own origin while `upstream` is OpenAI's, else"
            " `upstream`, so one upstream given alone still takes every request."
        ),
    )
    routes: list[RouteSettings] = Field(
        default_factory=list,
        description=(
            "More upstreams, each with the requests it takes (path prefix, model pattern, header, API) and its own"
            " `upstream_ca_bundle`, timeouts and probes; the first that matches wins, before the built-in"
            " `anthropic` and `default` routes. Flag and environment form: `name=URL;condition=value;...` (the flag"
            " repeated once per route); see docs/routes.md."
        ),
    )

    @field_validator("upstream", "anthropic_upstream")
    @classmethod
    def _check_upstream(cls, value: str | None) -> str | None:
        return None if value is None else check_origin(value)

    @field_validator("routes")
    @classmethod
    def _check_routes(cls, value: list[RouteSettings]) -> list[RouteSettings]:
        names = [route.name for route in value]
        if len(set(names)) < len(names):
            raise ValueError("route names must differ from each other")
        if idle := [route.name for route in value if not route.conditional]:
            raise ValueError(f"route {idle[0]!r} names no condition (path_prefix, models, header or api)")
        return value

    def route_table(self) -> tuple[RouteSettings, ...]:
        """Every route in the order they are matched: `routes`, then the built-in `anthropic` and `default`.

        `anthropic` is left out when it would go where `default` goes: one upstream takes everything, as before.
        """
        anthropic = self.anthropic_upstream
        if anthropic is None:
            anthropic = ANTHROPIC_ORIGIN if self.upstream == OPENAI_ORIGIN else self.upstream
        builtin = (
            [RouteSettings.builtin(ANTHROPIC_ROUTE, anthropic, api="anthropic")] if anthropic != self.upstream else []
        )
        return (*self.routes, *builtin, RouteSettings.builtin(DEFAULT_ROUTE, self.upstream))

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
