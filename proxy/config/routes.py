"""Routes: the upstreams of one proxy, and which requests each receives.

A route is an upstream of its own (origin, TLS trust, timeouts, window and count probes, connection pool) and the
requests it takes: those under a path prefix, naming a model that matches a pattern, carrying a header, or speaking
one API. The table is read in order and the first route that matches takes the request; then come the two routes
every proxy has, by API:

- `anthropic`: the Messages API and its other endpoints (any request with `anthropic-version`) go to
  `anthropic_upstream`, which defaults to Anthropic's own origin while `upstream` is OpenAI's (its default);
- `default`: everything else goes to `upstream`.

So a proxy with no settings serves `OPENAI_BASE_URL` and `ANTHROPIC_BASE_URL` users alike, and one given a single
`upstream` sends every request there, exactly as before routes existed.
"""

from __future__ import annotations

import re
from typing import Final, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from proxy.config.kinds import CABundle, PositiveSeconds
from proxy.config.probe_names import COUNT_PROBES, WINDOW_PROBES, known_names

OPENAI_ORIGIN: Final = "https://api.openai.com"
"""`upstream` when it is not set."""
ANTHROPIC_ORIGIN: Final = "https://api.anthropic.com"
"""Where the Messages API goes when neither `upstream` nor `anthropic_upstream` is set."""
DEFAULT_ROUTE: Final = "default"
"""The route of every request no other route takes: to `upstream`."""
ANTHROPIC_ROUTE: Final = "anthropic"
"""The route of the Messages API's requests (by path or `anthropic-version`): to `anthropic_upstream`."""

DEFAULT_API: Final = "openai"
"""The API of a request no format claims (by path or `api_headers`)."""

Api = Literal["openai", "anthropic"]
"""An API a request speaks: Anthropic's (the Messages API, or any request with `anthropic-version`), else OpenAI's."""

UPSTREAM_FIELDS: Final = (
    "upstream",
    "upstream_ca_bundle",
    "connect_timeout",
    "first_byte_timeout",
    "idle_timeout",
    "window_probes",
    "count_probes",
)
"""The settings a route has its own of; a route that leaves one unset uses the proxy's."""

_NAME: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")


def check_origin(value: str) -> str:
    """An upstream base URL, normalized (no trailing slash), or ValueError saying what is wrong with it."""
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


class RouteSettings(BaseModel):
    """One upstream and the requests it takes: every condition given must hold (a route with none takes nothing).

    Its upstream settings (`UPSTREAM_FIELDS`) left unset are the proxy's own.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="The route's name: in the `upstream` metrics label and the access log.")
    upstream: str = Field(description="Base URL of this route's upstream, as `upstream` is for the proxy.")
    path_prefix: str | None = Field(
        default=None,
        description="Takes requests whose path starts with this (e.g. `/backend-api/codex` for the ChatGPT backend).",
    )
    models: list[str] = Field(
        default_factory=list,
        description=(
            "Takes requests of a compacted format whose `model` matches one of these shell-style patterns (`llama-*`,"
            " `qwen3:*`). Requests whose body is not read (other endpoints, WebSocket upgrades) never match."
        ),
    )
    header: str | None = Field(
        default=None,
        description=(
            "Takes requests that carry this header (`ChatGPT-Account-ID`), or, as `Name=pattern`, whose value matches"
            " the shell-style pattern."
        ),
    )
    api: Api | None = Field(default=None, description="Takes requests of this API only: `openai` or `anthropic`.")
    upstream_ca_bundle: CABundle | None = None
    connect_timeout: PositiveSeconds | None = None
    first_byte_timeout: PositiveSeconds | None = None
    idle_timeout: PositiveSeconds | None = None
    window_probes: list[str] | None = None
    count_probes: list[str] | None = None

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not _NAME.fullmatch(value) or value in (DEFAULT_ROUTE, ANTHROPIC_ROUTE):
            raise ValueError(
                "must be 1-32 lower-case letters, digits, '-' or '_', and not 'default' or 'anthropic' (the built-in"
                " routes)"
            )
        return value

    @field_validator("upstream")
    @classmethod
    def _check_upstream(cls, value: str) -> str:
        return check_origin(value)

    @field_validator("path_prefix")
    @classmethod
    def _check_prefix(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("must start with /")
        return value

    @field_validator("window_probes", "count_probes")
    @classmethod
    def _check_probes(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        known = WINDOW_PROBES if info.field_name == "window_probes" else COUNT_PROBES
        return None if value is None else known_names(value, known, (info.field_name or "").replace("_", " "))

    @classmethod
    def builtin(cls, name: str, upstream: str, *, api: Api | None = None) -> RouteSettings:
        """One of the built-in routes (`anthropic`, `default`), of origins the settings validated already."""
        return cls.model_construct(name=name, upstream=upstream, api=api)

    def overrides(self) -> dict[str, object]:
        """The upstream settings this route sets itself, by field name."""
        return {field: value for field in UPSTREAM_FIELDS if (value := getattr(self, field)) is not None}

    @property
    def conditional(self) -> bool:
        """Whether the route names any condition (one that names none would take nothing)."""
        return bool(self.path_prefix or self.models or self.header or self.api)


def parse_route(text: str) -> dict[str, object]:
    """A route in the flag and environment form `name=URL;condition=value;...` as the settings model reads it.

    Conditions and settings are the route's field names (`path_prefix`, `models` with `|` between patterns,
    `header`, `api`, the timeouts, `upstream_ca_bundle`). Example:
    `local=http://127.0.0.1:8080;models=llama-*|qwen*`.

    :raises ValueError: Not of that form.
    """
    head, *rest = [part.strip() for part in text.split(";") if part.strip()] or [""]
    name, sep, url = head.partition("=")
    if not sep or not name.strip() or not url.strip():
        raise ValueError(f"expected name=URL;condition=value;..., got {text[:80]!r}")
    route: dict[str, object] = {"name": name.strip(), "upstream": url.strip()}
    for part in rest:
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"expected condition=value in route {name.strip()!r}, got {part[:80]!r}")
        listed = key in ("models", "window_probes", "count_probes")
        route[key] = [item.strip() for item in value.split("|") if item.strip()] if listed else value.strip()
    return route
