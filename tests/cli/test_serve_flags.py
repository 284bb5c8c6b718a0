"""`serve --help` lists every setting with its default, and every usage or settings error is one line that helps."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from proxy.cli import build_parser
from proxy.config import Settings, env_name
from proxy.settings_flags import SECRET_FIELDS, flag_of, settings_from_args


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", *args], capture_output=True, text=True, timeout=60, check=False
    )


def serve_help() -> str:
    result = run("serve", "--help")
    assert result.returncode == 0, result.stderr
    return " ".join(result.stdout.split())  # argparse wraps lines; compare words


def test_serve_help_lists_every_setting_with_its_default_and_variable() -> None:
    text = serve_help()
    for name in Settings.model_fields:
        if name in SECRET_FIELDS:
            continue
        entry = text[text.index(f" {flag_of(name)} ") :]
        assert re.match(rf" {flag_of(name)} \S+ .*?\(default: [^;]+; env: {env_name(name)}\)", entry), name


def test_secrets_have_no_flag_and_the_help_says_where_they_go() -> None:
    assert set(SECRET_FIELDS) == {"tenant_key", "proxy_keys", "summary_api_key"}
    text = serve_help()
    for name in SECRET_FIELDS:
        assert f"--{name.replace('_', '-')}" not in text
        assert env_name(name) in text
    assert "a secret on a command line is visible to every local user" in text


def test_every_flag_reaches_its_setting() -> None:
    args = build_parser().parse_args(
        [
            *("serve", "--precompact-at", "0.65", "--rewrite-memory", "false", "--summary-wait-seconds", "2"),
            *("--max-headers", "64", "--client-body-timeout", "9", "--strategies", "sliding_window,middle_out"),
            *("--context-window", "a=100", "--context-window", "b=200,c=300"),
        ]
    )
    settings = settings_from_args(args)
    assert (settings.precompact_at, settings.rewrite_memory, settings.summary_wait_seconds) == (0.65, False, 2.0)
    assert (settings.max_headers, settings.client_body_timeout) == (64, 9.0)
    assert settings.strategies == ["sliding_window", "middle_out"]
    assert settings.context_windows == {"a": 100, "b": 200, "c": 300}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["serve", "--bogus"], "unrecognized arguments: --bogus"),
        (["serve", "--mode", "loud"], "'mode' (from --mode): Input should be 'enforce' or 'observe'"),
        (["compact", "-"], "the following arguments are required: --context-window"),
        (["compact", "-", "--context-window", "100", "--strategy", "middle_out"], "unrecognized arguments: --strategy"),
        (["serve", "--context-window", "m=-1"], "'context_windows' (from --context-window): window of 'm' must be"),
        (["serve", "--context-window", "foo"], "(from --context-window): expected model=tokens, got 'foo'"),
        (
            ["serve", "--compact-at", "1.5"],
            "'compact_at' (from --compact-at): Input should be less than or equal to 1, got 1.5",
        ),
        (
            ["compact", "-", "--context-window", "100", "--compact-at", "1.5"],
            "'compact_at' (from --compact-at): Input should be less than or equal to 1, got 1.5",
        ),
        (
            ["serve", "--upstream", "http://localhost:8000/v1"],
            "'upstream' (from --upstream): must not end in /v1, which clients already send in every path"
            " (/v1/v1/... would get 404): pass http://localhost:8000",
        ),
        (["serve", "--upstream", "https://api.groq.com/openai/v1/"], "pass https://api.groq.com/openai"),
    ],
)
def test_errors_are_one_line_naming_what_exists(args: list[str], message: str) -> None:
    result = run(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]
    for flag in re.findall(r"\(from (--[a-z-]+)\)", lines[0]):
        assert flag in run(args[0], "--help").stdout, f"the error names {flag}, which {args[0]} does not have"


def test_compact_takes_the_strategy_list_as_serve_does() -> None:
    body = '{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}'
    result = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "compact", "-", "--context-window", "100", "--strategies", "middle_out"],
        input=body,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--strategies A,B,..." in serve_help()
    assert "--strategies A,B,..." in run("compact", "--help").stdout
    refused = run("compact", "-", "--context-window", "100", "--strategies", "summarization")
    assert refused.returncode == 2 and "summarization cannot run offline" in refused.stderr
