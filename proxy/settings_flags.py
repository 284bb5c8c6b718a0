"""Command-line flags for the settings, generated from the `Settings` model so `serve --help` lists every one.

Each field gets `--<field-name>` (underscores become dashes) with its own description and default as the help, and
takes its value in the same syntax as its `COMPACTION_PROXY_*` variable: the loader parses both the same way and the
settings model validates them once. Fields holding secrets get no flag on purpose (see `SECRET_FIELDS`).
"""

from __future__ import annotations

import argparse
import enum
import types
import typing
from collections.abc import Mapping
from typing import Any, Final

from pydantic import SecretStr
from pydantic.fields import FieldInfo

from proxy.config import Settings, env_name, load_settings

FLAGS: Final[Mapping[str, str]] = {"context_windows": "--context-window", "routes": "--route", "prices": "--price"}
"""Flags not spelled `--<field-name>`: `--context-window MODEL=TOKENS` is given once per model, `--route
NAME=URL;...` once per route, `--price MODEL=input:N;...` once per model."""

REPEATED: Final = frozenset({"context_windows", "routes", "prices"})
METAVARS: Final[Mapping[str, str]] = {
    "routes": "NAME=URL;CONDITION=VALUE;...",
    "prices": "MODEL=input:N;cached:N;cache_write:N;output:N",
}
"""Values the help shows for fields whose type says too little."""
"""Fields whose flag may be repeated; the values are joined with commas, as the environment spells a mapping."""


def _holds_secret(annotation: Any) -> bool:
    """Whether a field's type is, or contains, `SecretStr`."""
    if annotation is SecretStr:
        return True
    return any(_holds_secret(argument) for argument in typing.get_args(annotation))


SECRET_FIELDS: Final = tuple(name for name, info in Settings.model_fields.items() if _holds_secret(info.annotation))
"""Settings with no flag: a secret on a command line is visible to every local user (`ps`, `/proc/<pid>/cmdline`)."""


def flag_of(field: str) -> str:
    """The flag that sets `field`."""
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def _metavar(info: FieldInfo) -> str:
    """What the help shows as the value: the choices of an enum, else a word for the type."""
    annotation: Any = info.annotation
    arguments = [argument for argument in typing.get_args(annotation) if argument is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(arguments) == 1:
        annotation = arguments[0]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "{" + ",".join(str(member.value) for member in annotation) + "}"
    origin = typing.get_origin(annotation)
    if origin is list:
        return "A,B,..."
    if origin is dict:
        return "MODEL=TOKENS"
    return {bool: "{true,false}", int: "N", float: "NUMBER"}.get(annotation, "TEXT")


def _default(info: FieldInfo) -> str:
    """The default as the help shows it."""
    value = info.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(str(item) for item in value) or "none"
    if isinstance(value, dict):
        return ",".join(f"{key}={tokens}" for key, tokens in value.items()) or "none"
    return str(value)


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """Add `--config` and one flag per setting except `SECRET_FIELDS`, each helped by its description and default."""
    group = parser.add_argument_group(
        "settings (flags > COMPACTION_PROXY_* environment > config file > defaults)",
        f"{', '.join(SECRET_FIELDS)} have no flag on purpose: a secret on a command line is visible to every local"
        f" user. Set them in the environment ({', '.join(env_name(name) for name in SECRET_FIELDS)}) or the config"
        " file.",
    )
    group.add_argument("--config", metavar="PATH", help="YAML or JSON config file (env: COMPACTION_PROXY_CONFIG)")
    for name, info in Settings.model_fields.items():
        if name in SECRET_FIELDS:
            continue
        description = (info.description or "").replace("%", "%%")
        group.add_argument(
            flag_of(name),
            dest=name,
            metavar=METAVARS.get(name) or _metavar(info),
            action="append" if name in REPEATED else "store",
            help=f"{description} (default: {_default(info)}; env: {env_name(name)})",
        )


def settings_from_args(args: argparse.Namespace, **overrides: Any) -> Settings:
    """Load the settings with the given flags on top (a flag not given is None), then `overrides` on top of those.

    :raises ConfigError: A value anywhere is invalid; the message names the flag, variable or file it came from.
    """
    cli: dict[str, Any] = {}
    for name in Settings.model_fields:
        value = getattr(args, name, None)
        cli[name] = ",".join(value) if name in REPEATED and value is not None else value
    cli.update({name: value for name, value in overrides.items() if value is not None})
    flags = {name: flag_of(name) for name in cli}
    return load_settings(cli=cli, config_file=getattr(args, "config", None), flags=flags)
