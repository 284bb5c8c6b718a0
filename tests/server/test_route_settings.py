"""The route table the settings describe, in every way it can be given, and which route a request takes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.cli import build_parser, settings_from_args
from proxy.config import ConfigError, Settings, load_settings
from proxy.config.routes import DEFAULT_API
from proxy.formats import api_of
from proxy.server.route_table import Route, RouteTable
from tests.support.examples import examples

LOCAL = "local=http://127.0.0.1:8080;models=llama-*|qwen*"
CHATGPT = "chatgpt=https://chatgpt.com;path_prefix=/backend-api/codex;header=ChatGPT-Account-ID"


def table(configured: Settings) -> RouteTable:
    """The table's routes without their clients: what a request is matched against."""
    return RouteTable(tuple(Route(route, None) for route in configured.route_table()))  # type: ignore[arg-type]


def origins(configured: Settings) -> list[tuple[str, str]]:
    return [(route.name, route.upstream) for route in configured.route_table()]


def test_no_settings_serve_both_providers() -> None:
    assert origins(Settings()) == [("anthropic", "https://api.anthropic.com"), ("default", "https://api.openai.com")]


def test_one_upstream_alone_takes_every_request() -> None:
    assert origins(Settings(upstream="http://127.0.0.1:9")) == [("default", "http://127.0.0.1:9")]


def test_an_anthropic_upstream_beside_it_takes_the_messages_api() -> None:
    configured = Settings(upstream="http://127.0.0.1:9", anthropic_upstream="http://127.0.0.1:10/")
    assert origins(configured) == [("anthropic", "http://127.0.0.1:10"), ("default", "http://127.0.0.1:9")]


def test_flags_environment_and_file_give_the_same_routes(tmp_path: Path) -> None:
    args = build_parser().parse_args(["serve", "--route", LOCAL, "--route", CHATGPT])
    from_flags = settings_from_args(args).routes
    from_env = load_settings(environ={"COMPACTION_PROXY_ROUTES": f"{LOCAL},{CHATGPT}"}).routes
    file = tmp_path / "proxy.yaml"
    listed: list[dict[str, Any]] = [
        {"name": "local", "upstream": "http://127.0.0.1:8080", "models": ["llama-*", "qwen*"]},
        {
            "name": "chatgpt",
            "upstream": "https://chatgpt.com",
            "path_prefix": "/backend-api/codex",
            "header": "ChatGPT-Account-ID",
        },
    ]
    file.write_text(yaml.safe_dump({"routes": listed}))
    from_file = load_settings(environ={}, config_file=file).routes
    assert from_flags == from_env == from_file
    assert [route.name for route in from_file] == ["local", "chatgpt"]


def test_a_route_s_own_settings_replace_the_proxy_s_for_its_clients() -> None:
    route = {"name": "slow", "upstream": "http://127.0.0.1:7", "api": "openai", "first_byte_timeout": 900}
    configured = Settings(upstream="http://127.0.0.1:9", idle_timeout=30, routes=[route])
    own = configured.for_route(configured.routes[0])
    assert (own.upstream, own.first_byte_timeout, own.idle_timeout) == ("http://127.0.0.1:7", 900, 30)
    assert configured.for_route(configured.route_table()[-1]) is configured


@pytest.mark.parametrize(
    ("routes", "expected"),
    [
        ("x=http://h", "route 'x' names no condition"),
        ("x=http://h;api=openai,x=http://i;api=openai", "route names must differ"),
        ("default=http://h;api=openai", "not 'default' or 'anthropic'"),
        ("x=ftp://h;api=openai", "must be an http:// or https:// URL"),
        ("x=http://h/v1;api=openai", "must not end in /v1"),
        ("x=http://h;path_prefix=v1", "must start with /"),
        ("x=http://h;colour=red", "routes.0.colour"),
        ("x=http://h;api=openai;window_probes=nope", "unknown window probes"),
        ("http://h", "expected name=URL"),
    ],
)
def test_bad_routes_give_one_line_errors(routes: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={"COMPACTION_PROXY_ROUTES": routes})
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_first_route_whose_every_condition_holds_takes_the_request() -> None:
    configured = load_settings(environ={"COMPACTION_PROXY_ROUTES": f"{LOCAL},{CHATGPT}"})
    routes = table(configured)

    def chosen(path: str, headers: dict[str, str], model: str | None = None) -> str:
        return routes.choose("POST", path, headers, model).name

    assert chosen("/v1/chat/completions", {}, "llama-3-8b") == "local"
    assert chosen("/v1/chat/completions", {}, "gpt-4o") == "default"
    assert chosen("/backend-api/codex/responses", {"ChatGPT-Account-ID": "a"}) == "chatgpt"
    assert chosen("/backend-api/codex/responses", {}) == "default"  # both conditions must hold
    assert chosen("/v1/messages", {}) == "anthropic"
    assert chosen("/v1/models", {"anthropic-version": "2023-06-01"}) == "anthropic"
    assert chosen("/v1/messages", {}, "qwen3") == "local"  # the operator's routes come first


paths = st.sampled_from(["/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/models", "/v1/embeddings"])
headers = st.dictionaries(st.sampled_from(["anthropic-version", "ChatGPT-Account-ID", "Authorization"]), st.text())


@settings(max_examples=examples(100))
@given(path=paths, sent=headers, model=st.none() | st.text(max_size=20))
def test_one_upstream_takes_everything_and_two_split_by_api(path: str, sent: dict[str, str], model: str | None) -> None:
    alone = table(Settings(upstream="http://127.0.0.1:9"))
    assert alone.choose("POST", path, sent, model).name == "default"
    split = table(Settings())
    # A request of an OpenAI format is OpenAI's whatever it carries; another endpoint is Anthropic's by its header.
    openai_format = path in ("/v1/chat/completions", "/v1/responses")
    anthropic = path == "/v1/messages" or (not openai_format and "anthropic-version" in sent)
    assert split.choose("POST", path, sent, model).name == ("anthropic" if anthropic else "default")


@settings(max_examples=examples(100))
@given(
    routes=st.sampled_from(
        ["", "codex=http://127.0.0.1:7;path_prefix=/backend-api", "x=http://127.0.0.1:7;api=openai"]
    ),
    requests=st.lists(st.tuples(paths | st.just("/backend-api/codex/responses"), headers), max_size=8),
)
def test_a_remembered_route_is_the_first_whose_conditions_hold(
    routes: str, requests: list[tuple[str, dict[str, str]]]
) -> None:
    routes_table = table(load_settings(environ={"COMPACTION_PROXY_ROUTES": routes} if routes else {}))
    for path, sent in requests:
        chosen = routes_table.choose("POST", path, sent)
        wire = api_of("POST", path, sent)
        api = wire.api if wire is not None else DEFAULT_API
        assert chosen is next(route for route in routes_table.routes if route.takes(path, sent, None, api))
