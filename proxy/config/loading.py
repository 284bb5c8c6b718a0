"""Loading the settings: flags, environment, a config file and defaults, merged by precedence and validated once.

Precedence, highest first: command-line flags > environment variables (`COMPACTION_PROXY_<FIELD>`) > the config
file (YAML or JSON, path from `--config` or `COMPACTION_PROXY_CONFIG`) > the defaults the settings declare. Every
source is merged into one dict and validated once, so a bad value anywhere stops start-up with a `ConfigError` whose
one-line message names the field and where the value came from.
"""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from proxy.config.prices import parse_prices
from proxy.config.routes import parse_route
from proxy.config.settings import FIELDS, Settings

ENV_PREFIX: Final = "COMPACTION_PROXY_"
"""Prefix of every environment variable the proxy reads: `COMPACTION_PROXY_PORT` sets `port`, and so on."""

CONFIG_ENV: Final = ENV_PREFIX + "CONFIG"
"""Environment variable naming the config file when `--config` is not given."""


_RANGE_ERRORS: Final = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})
"""Pydantic's error types for a number outside its bounds."""


class ConfigError(ValueError):
    """A setting could not be loaded or is invalid; the message is one line, fit to show the operator as-is."""


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


def _from_text(field: str, raw: str) -> Any:
    """Turn one environment or flag string into what the model validates: lists and dicts parsed, empty means None."""
    if field in ("strategies", "proxy_keys", "window_probes", "count_probes", "superseded_tools"):
        return _split_list(raw)
    if field == "context_windows":
        return _split_mapping(raw)
    if field == "routes":
        return json.loads(raw) if raw.strip().startswith("[") else [parse_route(part) for part in raw.split(",")]
    if field == "prices":
        return json.loads(raw) if raw.strip().startswith("{") else parse_prices(raw)
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
    flags: Mapping[str, str] | None = None,
) -> Settings:
    """Merge every source by precedence and validate once.

    :param cli: Values from command-line flags, by field name; None values are treated as not given. Strings are
        read in the environment's syntax (comma-separated lists, `model=tokens` mappings).
    :param environ: The environment to read `COMPACTION_PROXY_*` from; `os.environ` when None.
    :param config_file: Config file path (from `--config`); falls back to `COMPACTION_PROXY_CONFIG`.
    :param flags: The flag each `cli` value came from, as errors name it; `--<field-name>` for fields not in it.
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
                values[field] = _from_text(field, env[name])
            except ValueError as exc:
                raise ConfigError(f"invalid setting {field!r} (from {name}): {exc}") from None
            sources[field] = name

    for field, value in (cli or {}).items():
        if value is None:
            continue
        flag = (flags or {}).get(field, "--" + field.replace("_", "-"))
        try:
            values[field] = _from_text(field, value) if isinstance(value, str) else value
        except ValueError as exc:
            raise ConfigError(f"invalid setting {field!r} (from {flag}): {exc}") from None
        sources[field] = flag

    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, sources)) from None


def _describe(exc: ValidationError, sources: Mapping[str, str]) -> str:
    """Summarize a validation error in one line: the first failing field, where its value came from, and why.

    The value itself is quoted only for a number out of its range (`Input should be less than or equal to 1, got
    1.5`): other values may be secrets or long, and are never echoed.
    """
    error = exc.errors(include_url=False)[0]
    loc = [str(part) for part in error["loc"]]
    message = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] in _RANGE_ERRORS:
        message += f", got {str(error['input'])[:32]}"
    if not loc:
        return f"invalid settings: {message}"
    field, detail = loc[0], ".".join(loc)
    if error["type"] == "extra_forbidden":
        where = sources.get(field, "settings")
        return f"unknown setting {detail!r} (in {where})"
    where = sources.get(field, "default")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"invalid setting {detail!r} (from {where}): {message}{more}"
