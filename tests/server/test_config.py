"""Settings precedence (flags > environment > config file > defaults) and one-line errors, also via the CLI."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from proxy.cli import build_parser, settings_from_args
from proxy.config import ConfigError, Mode, Settings, load_settings
from proxy.config.state import TENANT_HEADERS
from proxy.engine import DEFAULT_CHAIN
from tests.support.examples import examples


def cli_command() -> list[str]:
    script = Path(sys.executable).with_name("compaction-proxy")
    return [str(script)] if script.exists() else [sys.executable, "-m", "proxy.cli"]


def test_defaults() -> None:
    settings = load_settings(environ={})
    assert settings.upstream == "https://api.openai.com"
    assert (settings.host, settings.port, settings.mode) == ("127.0.0.1", 8080, Mode.ENFORCE)
    assert settings.strategies == list(DEFAULT_CHAIN), "the proxy's default chain is the engine's"
    assert settings.superseded_tools == []
    assert settings.max_body_bytes == 64 * 1024 * 1024
    assert settings.state_url == "memory://"
    assert len(settings.tenant_key.get_secret_value()) >= 16
    assert settings.tenant_key.get_secret_value() not in repr(settings)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_flags_beat_environment_beat_file_beat_defaults(tmp_path: Path, suffix: str) -> None:
    values = {
        "port": 7000,
        "mode": "observe",
        "compact_at": 0.8,
        "upstream": "http://file.example",
        "log_level": "debug",
    }
    path = tmp_path / f"proxy{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(values))
    else:
        path.write_text("".join(f"{key}: {value}\n" for key, value in values.items()))
    env = {
        "COMPACTION_PROXY_CONFIG": str(path),
        "COMPACTION_PROXY_PORT": "7100",
        "COMPACTION_PROXY_UPSTREAM": "http://env.example/base/",
        "COMPACTION_PROXY_CONTEXT_WINDOWS": "my-model=32000,other=8000",
        "COMPACTION_PROXY_STRATEGIES": '["sliding_window"]',
    }
    settings = load_settings(cli={"port": "7200", "upstream": None}, environ=env)
    assert settings.port == 7200  # flag
    assert settings.upstream == "http://env.example/base"  # env (the flag was not given)
    assert settings.mode is Mode.OBSERVE and settings.compact_at == 0.8  # file
    assert settings.compact_to == 0.4  # default
    assert settings.context_windows == {"my-model": 32000, "other": 8000}
    assert settings.strategies == ["sliding_window"]


def test_cli_flags_reach_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_MODE", "observe")
    args = build_parser().parse_args(
        ["serve", "--port", "9", "--context-window", "a=100", "--strategies", "x,y", "--compact-to", "0.3"]
    )
    settings = settings_from_args(args, port=args.port)
    assert (settings.port, settings.context_windows, settings.strategies) == (9, {"a": 100}, ["x", "y"])
    assert settings.compact_to == 0.3 and settings.mode is Mode.OBSERVE


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"COMPACTION_PROXY_PORT": "eighty"}, "invalid setting 'port' (from COMPACTION_PROXY_PORT)"),
        ({"COMPACTION_PROXY_MODE": "loud"}, "invalid setting 'mode' (from COMPACTION_PROXY_MODE)"),
        ({"COMPACTION_PROXY_UPSTREAM": "ftp://x"}, "invalid setting 'upstream'"),
        ({"COMPACTION_PROXY_COMPACT_TO": "0.9"}, "compact_to (0.9) must be below compact_at (0.7)"),
        ({"COMPACTION_PROXY_TENANT_KEY": "short"}, "invalid setting 'tenant_key'"),
        ({"COMPACTION_PROXY_CONTEXT_WINDOWS": "m=-1"}, "invalid setting 'context_windows'"),
        ({"COMPACTION_PROXY_CONFIG": "/nonexistent/proxy.yaml"}, "cannot read config file"),
    ],
)
def test_bad_values_give_one_line_errors(env: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ=env)
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)
    assert "short" not in str(caught.value)  # never echo a secret back


def test_unknown_key_in_config_file(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("prot: 1\n")
    with pytest.raises(ConfigError, match="unknown setting 'prot'"):
        load_settings(environ={}, config_file=path)


def test_tenant_ids_are_keyed_hashes() -> None:
    one = Settings(tenant_key="k" * 32)
    other = Settings(tenant_key="j" * 32)
    alice = {"Authorization": "Bearer sk-alice"}
    assert one.tenant_of(alice) == one.tenant_of({"authorization": "Bearer sk-alice"})
    assert one.tenant_of(alice) != one.tenant_of({"Authorization": "Bearer sk-bob"})
    assert one.tenant_of(alice) != other.tenant_of(alice)
    assert "sk-alice" not in one.tenant_of(alice)


_CREDENTIAL_NAMES = st.sampled_from(["authorization", "Authorization", "x-api-key", "api-key", "x-proxy-key", "other"])


@hypothesis_settings(max_examples=examples(200))
@given(
    calls=st.lists(
        st.tuples(st.sampled_from(["k" * 32, "j" * 32]), st.dictionaries(_CREDENTIAL_NAMES, st.text(max_size=6))),
        max_size=30,
    )
)
def test_a_remembered_tenant_id_is_always_the_keyed_hash_of_the_callers_own_credentials(
    calls: list[tuple[str, dict[str, str]]],
) -> None:
    # Repeated and interleaved callers under two tenant keys each get exactly the HMAC of their own credential
    # headers under their own key (the pipeline remembers them per caller: tests/pipeline/test_decided_once.py).
    tenant_settings = {key: Settings(tenant_key=key) for key in ("k" * 32, "j" * 32)}
    for key, headers in calls:
        lowered = {name.lower(): value for name, value in headers.items()}
        material = "\n".join(f"{name}:{lowered.get(name, '')}" for name in TENANT_HEADERS)
        expected = hmac.new(key.encode(), material.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()
        assert tenant_settings[key].tenant_of(headers) == expected[:32]


def test_serve_with_a_bad_environment_value_exits_2_with_one_line() -> None:
    env = {**os.environ, "COMPACTION_PROXY_PORT": "not-a-port"}
    result = subprocess.run([*cli_command(), "serve"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "port" in lines[0] and "COMPACTION_PROXY_PORT" in lines[0]
    assert "Traceback" not in result.stderr


def test_the_example_secrets_placeholder_is_refused() -> None:
    secret = yaml.safe_load((Path(__file__).parents[2] / "deploy/kubernetes/gateway/secret.yaml").read_text())
    placeholder = secret["stringData"]["tenant-key"]
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={"COMPACTION_PROXY_TENANT_KEY": placeholder})
    assert "placeholder" in str(caught.value) and "openssl rand -hex 32" in str(caught.value)
    assert placeholder not in str(caught.value)  # a secret's value is never echoed, placeholder or not
