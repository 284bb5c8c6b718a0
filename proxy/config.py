"""The proxy's settings: one validated pydantic model, loaded from flags, environment, a config file and defaults.

Precedence, highest first: command-line flags > environment variables (`COMPACTION_PROXY_<FIELD>`) > the config
file (YAML or JSON, path from `--config` or `COMPACTION_PROXY_CONFIG`) > the defaults declared here. Every source is
merged into one dict and validated once, so a bad value anywhere stops start-up with a `ConfigError` whose one-line
message names the field and where the value came from.

This module imports neither aiohttp nor the engine: the compaction side and the CLI can both read settings cheaply.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import json
import os
import secrets
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

ENV_PREFIX: Final = "COMPACTION_PROXY_"
"""Prefix of every environment variable the proxy reads: `COMPACTION_PROXY_PORT` sets `port`, and so on."""

CONFIG_ENV: Final = ENV_PREFIX + "CONFIG"
"""Environment variable naming the config file when `--config` is not given."""

MIB: Final = 1024 * 1024

DEFAULT_STRATEGIES: Final = ("tool_result_pruning", "sliding_window", "middle_out")

CREDENTIAL_HEADERS: Final = ("authorization", "api-key", "x-api-key")
"""Request headers that carry the caller's credentials (OpenAI bearer token, Azure `api-key`, others' `x-api-key`)."""


class ConfigError(ValueError):
    """A setting could not be loaded or is invalid; the message is one line, fit to show the operator as-is."""


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


PositiveSeconds = Annotated[float, Field(gt=0)]


def _random_tenant_key() -> SecretStr:
    return SecretStr(secrets.token_urlsafe(32))


class Settings(BaseModel):
    """Everything the proxy can be configured with. Immutable once loaded; see `load_settings` for the sources."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, use_enum_values=False)

    upstream: str = Field(
        default="https://api.openai.com",
        description=(
            "Base URL of the real provider (scheme, host, optional port and base path). Every request is forwarded to"
            " this origin, never elsewhere: a request path `/v1/models` goes to `<upstream>/v1/models`, and a base"
            " path such as `https://api.groq.com/openai` is prepended. No query string or fragment."
        ),
    )
    host: str = Field(default="0.0.0.0", description="Interface the proxy listens on (`0.0.0.0`: all IPv4).")
    port: int = Field(default=8080, ge=0, le=65535, description="TCP port the proxy listens on; 0 picks a free one.")
    mode: Mode = Field(
        default=Mode.ENFORCE,
        description="`enforce` rewrites oversized conversations; `observe` only decides and reports, changing nothing.",
    )
    compact_at: float = Field(
        default=0.7,
        gt=0,
        le=1,
        description=(
            "Trigger: compact a chat request once its estimated prompt reaches this fraction of the model's context"
            " window (0 < compact_to < compact_at <= 1)."
        ),
    )
    compact_to: float = Field(
        default=0.4,
        gt=0,
        lt=1,
        description="Target: a compaction shrinks the messages to this fraction of the window, minus tools/template.",
    )
    strategies: list[str] = Field(
        default_factory=lambda: list(DEFAULT_STRATEGIES),
        description=(
            "The compaction chain, in order; each runs only while the conversation is still over the target."
            " Names are those of the engine's strategies (e.g. `tool_result_pruning`, `sliding_window`,"
            " `summarization`, `middle_out`). From the environment: a JSON list or comma-separated names."
        ),
    )
    context_windows: dict[str, int] = Field(
        default_factory=dict,
        description=(
            "Per-model context windows in tokens, overriding the shipped table: `{model name: tokens}`. From the"
            " environment: a JSON object or `model=tokens,model=tokens`."
        ),
    )
    default_context_window: int | None = Field(
        default=None,
        gt=0,
        description="Window assumed for models neither table knows; None leaves such requests uncompacted.",
    )
    conversation_header: str = Field(
        default="X-Conversation-Id",
        min_length=1,
        description="Request header that names a conversation explicitly: used for metrics, logs and grouping.",
    )
    state_url: str = Field(
        default="memory://",
        description="Where per-conversation state lives: `memory://` (in-process LRU) or `redis://host:port/db`.",
    )
    state_ttl_seconds: int = Field(
        default=86400, gt=0, description="How long an idle conversation's state (anchors, plans) is kept."
    )
    state_max_conversations: int = Field(
        default=100_000, gt=0, description="Bound on conversations kept by the in-memory store (least recent go)."
    )
    summary_model: str | None = Field(
        default=None,
        description=(
            "Model that writes summaries when `summarization` is in the chain; the request's own model when unset"
            " (the only choice that lets the provider's prompt cache serve the summarized prefix)."
        ),
    )
    summary_api_key: SecretStr | None = Field(
        default=None,
        description="Credential for summary calls; the caller's own `Authorization` header when unset. Never logged.",
    )
    precompact_at: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description=(
            "Fraction of the window at which the summary the next compaction will need starts being written in the"
            " background, so it is ready when `compact_at` is reached. Default: `compact_at - 0.1`."
        ),
    )
    summary_wait_seconds: float = Field(
        default=5.0,
        ge=0,
        description=(
            "How long a request that needs a summary waits for one still being written before the chain falls back"
            " to its next strategy."
        ),
    )
    summary_timeout_seconds: float = Field(
        default=120.0, gt=0, description="How long one summary call to the upstream may take before it is abandoned."
    )
    summary_concurrency: int = Field(
        default=4, gt=0, description="Summary calls in flight at once across all conversations."
    )
    summary_instruction: str | None = Field(
        default=None,
        description=(
            "The sections and rules a summary follows, replacing the built-in ones (objective, decisions, work done,"
            " exact identifiers, unresolved)."
        ),
    )
    summary_max_tokens: int | None = Field(
        default=None, gt=0, description="`max_completion_tokens` of a summary call; no limit when unset."
    )
    rewrite_memory: bool = Field(
        default=True,
        description=(
            "Remember each compaction and replay it byte for byte on later turns of the same conversation, so the"
            " upstream's prompt cache keeps hitting and a summary is paid for once. Off: every request is compacted"
            " afresh from what the client sent (only useful to measure what the memory saves)."
        ),
    )
    tenant_key: SecretStr = Field(
        default_factory=_random_tenant_key,
        description=(
            "Secret keying the hash of each caller's credentials that scopes all state, so callers never see each"
            " other's. Random per process when unset; set it (same value everywhere) when replicas share Redis."
            " Never logged."
        ),
    )
    max_body_bytes: int = Field(
        default=64 * MIB,
        gt=0,
        description="Largest request body accepted from a client, in bytes; larger ones get 413.",
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

    @field_validator("upstream")
    @classmethod
    def _check_upstream(cls, value: str) -> str:
        from urllib.parse import urlsplit

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
        return value.strip().rstrip("/")

    @field_validator("strategies")
    @classmethod
    def _check_strategies(cls, value: list[str]) -> list[str]:
        names = [name.strip() for name in value]
        if any(not name for name in names):
            raise ValueError("strategy names must not be empty")
        if len(set(names)) != len(names):
            raise ValueError("a strategy may appear only once")
        return names

    @field_validator("context_windows")
    @classmethod
    def _check_windows(cls, value: dict[str, int]) -> dict[str, int]:
        for model, tokens in value.items():
            if tokens <= 0:
                raise ValueError(f"window of {model!r} must be a positive number of tokens")
        return value

    @field_validator("state_url")
    @classmethod
    def _check_state_url(cls, value: str) -> str:
        if not value.startswith(("memory://", "redis://", "rediss://", "unix://")):
            raise ValueError("must be memory:// or a redis:// / rediss:// / unix:// URL")
        return value

    @field_validator("tenant_key")
    @classmethod
    def _check_tenant_key(cls, value: SecretStr) -> SecretStr:
        if len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters")
        return value

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

    @model_validator(mode="after")
    def _check_thresholds(self) -> Settings:
        if not self.compact_to < self.compact_at:
            raise ValueError(f"compact_to ({self.compact_to}) must be below compact_at ({self.compact_at})")
        if self.precompact_at is not None and not self.compact_to < self.precompact_at <= self.compact_at:
            raise ValueError(
                f"precompact_at ({self.precompact_at}) must lie between compact_to ({self.compact_to}) and compact_at"
                f" ({self.compact_at})"
            )
        return self

    @property
    def summary_start_at(self) -> float:
        """The fraction of the window at which a summary starts being written ahead of time."""
        if self.precompact_at is not None:
            return self.precompact_at
        return max(self.compact_at - 0.1, (self.compact_at + self.compact_to) / 2)

    def tenant_of(self, headers: Mapping[str, str]) -> str:
        """Return the caller's tenant id: a keyed hash (HMAC-SHA256 under `tenant_key`) of its credential headers.

        The compaction side scopes every state key with this, so one caller can never match, read or poison another's
        state, and nothing stored or logged reveals a credential. Callers without credentials share one tenant.

        :param headers: The request headers (any mapping; names are matched case-insensitively).
        """
        lowered = {name.lower(): value for name, value in headers.items()}
        material = "\n".join(f"{name}:{lowered.get(name, '')}" for name in CREDENTIAL_HEADERS)
        key = self.tenant_key.get_secret_value().encode()
        return hmac.new(key, material.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()[:32]


FIELDS: Final = tuple(Settings.model_fields)


def env_name(field: str) -> str:
    """Return the environment variable that sets `field`, e.g. `COMPACTION_PROXY_STATE_URL` for `state_url`."""
    return ENV_PREFIX + field.upper()


def _split_list(raw: str) -> Any:
    raw = raw.strip()
    if raw.startswith("["):
        return json.loads(raw)
    return [item for item in (part.strip() for part in raw.split(",")) if item]


def _split_mapping(raw: str) -> Any:
    raw = raw.strip()
    if raw.startswith("{"):
        return json.loads(raw)
    result: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        model, sep, tokens = item.rpartition("=")
        if not sep or not model:
            raise ValueError(f"expected model=tokens, got {item!r}")
        result[model.strip()] = tokens.strip()
    return result


def _from_env(field: str, raw: str) -> Any:
    """Turn one environment string into what the model validates: lists and dicts get parsed, empty means None."""
    if field in ("strategies", "proxy_keys"):
        return _split_list(raw)
    if field == "context_windows":
        return _split_mapping(raw)
    if field == "default_context_window" and raw.strip().lower() in ("", "none", "null"):
        return None
    return raw


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a config file: `.json` as JSON, anything else as YAML (a superset of JSON). Keys are field names."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(file)!r}: {exc.strerror or exc}") from None
    try:
        if file.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            try:
                yaml: Any = importlib.import_module("yaml")  # untyped; imported only for YAML files
            except ImportError:  # pragma: no cover - PyYAML ships with the dev extra
                raise ConfigError(f"config file {str(file)!r}: YAML needs PyYAML installed") from None
            data = yaml.safe_load(text)
    except ConfigError:
        raise
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"config file {str(file)!r} is not valid: {first}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(file)!r} must hold a mapping of setting names to values")
    return {str(key).replace("-", "_"): value for key, value in data.items()}


def load_settings(
    cli: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: str | Path | None = None,
) -> Settings:
    """Merge every source by precedence and validate once.

    :param cli: Values from command-line flags, by field name; None values are treated as not given.
    :param environ: The environment to read `COMPACTION_PROXY_*` from; `os.environ` when None.
    :param config_file: Config file path (from `--config`); falls back to `COMPACTION_PROXY_CONFIG`.
    :raises ConfigError: With a one-line message naming the bad field and the source of its value.
    """
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    path = config_file if config_file is not None else (env.get(CONFIG_ENV) or None)
    if path is not None:
        for key, value in read_config_file(path).items():
            values[key] = value
            sources[key] = f"config file {str(path)!r}"

    for field in FIELDS:
        name = env_name(field)
        if name in env:
            try:
                values[field] = _from_env(field, env[name])
            except ValueError as exc:
                raise ConfigError(f"invalid setting {field!r} (from {name}): {exc}") from None
            sources[field] = name

    for field, value in (cli or {}).items():
        if value is not None:
            values[field] = value
            sources[field] = "--" + field.replace("_", "-")

    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, sources)) from None


def _describe(exc: ValidationError, sources: Mapping[str, str]) -> str:
    """Summarize a validation error in one line: the first failing field, where its value came from, and why."""
    error = exc.errors(include_url=False, include_input=False)[0]
    loc = [str(part) for part in error["loc"]]
    message = str(error["msg"]).removeprefix("Value error, ")
    if not loc:
        return f"invalid settings: {message}"
    field = loc[0]
    if error["type"] == "extra_forbidden":
        where = sources.get(field, "settings")
        return f"unknown setting {field!r} (in {where})"
    where = sources.get(field, "default")
    detail = ".".join(loc)
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"invalid setting {detail!r} (from {where}): {message}{more}"
