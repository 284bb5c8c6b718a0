"""A model's prices: the operator's `prices` however given, then the price library at the request's provider, else
unknown (tokens only, never a guessed price)."""

from __future__ import annotations

import json
import shlex
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from proxy.billing.prices import LIBRARY, PriceBook, Rate, preload
from proxy.cli import build_parser, settings_from_args
from proxy.config import ConfigError, load_settings

LLAMA = "llama-*=input:0.2;cached:0.05;output:0.6"
MINE = "my-model=input:1;cached:0.1;cache_write:1.25;output:5"


def test_flags_environment_and_file_give_the_same_prices(tmp_path: Path) -> None:
    args = build_parser().parse_args(["serve", "--price", LLAMA, "--price", MINE])
    from_flags = settings_from_args(args).prices
    from_env = load_settings(environ={"COMPACTION_PROXY_PRICES": f"{LLAMA},{MINE}"}).prices
    listed = {
        "llama-*": {"input": 0.2, "cached": 0.05, "output": 0.6},
        "my-model": {"input": 1, "cached": 0.1, "cache_write": 1.25, "output": 5},
    }
    from_json = load_settings(environ={"COMPACTION_PROXY_PRICES": json.dumps(listed)}).prices
    file = tmp_path / "proxy.yaml"
    file.write_text(yaml.safe_dump({"prices": listed}))
    from_file = load_settings(environ={}, config_file=file).prices
    assert from_flags == from_env == from_json == from_file
    assert from_file["llama-*"].cache_write is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("llama=0.2", "expected MODEL=input:N;cached:N;cache_write:N;output:N, got 'llama=0.2'"),
        ("llama=input:x;output:1", "'prices.llama.input'"),
        ("llama=input:1", "'prices.llama.output' (from COMPACTION_PROXY_PRICES): Field required"),
        ("llama=input:1;output:1;discount:0.5", "'prices.llama.discount'"),
        ("llama=input:-1;output:1", "greater than or equal to 0"),
    ],
)
def test_a_bad_price_stops_start_up_naming_it(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match="prices") as raised:
        load_settings(environ={"COMPACTION_PROXY_PRICES": text})
    assert message in str(raised.value)


def test_the_operator_s_prices_come_first_exact_name_then_patterns_in_order() -> None:
    given = "gpt-4o*=input:9;output:9,gpt-4o-mini=input:1;output:2,gpt-*=input:7;output:7"
    prices = load_settings(environ={"COMPACTION_PROXY_PRICES": given}).prices
    book = PriceBook(prices)
    exact, pattern = book.rates("gpt-4o-mini", "chat_completions"), book.rates("gpt-4o", "responses")
    assert exact is not None and pattern is not None
    assert (exact.input.base, exact.output.base, exact.source) == (Decimal(1), Decimal(2), "prices['gpt-4o-mini']")
    assert (pattern.input.base, pattern.source) == (Decimal(9), "prices['gpt-4o*']")
    # An unset cache price is the input price; the pattern is read as the operator wrote it, for any API.
    assert exact.cached == exact.cache_write == exact.input
    llama = PriceBook(load_settings(environ={"COMPACTION_PROXY_PRICES": LLAMA}).prices).rates("llama-3-8b", "messages")
    assert llama is not None and llama.cached.base == Decimal("0.05")


def test_the_library_prices_a_model_at_the_provider_of_its_api() -> None:
    assert preload(), "the billing extra is installed with dev"
    book = PriceBook()
    mini = book.rates("gpt-4o-mini-2024-07-18", "chat_completions")
    assert mini is not None and mini.source.startswith(f"{LIBRARY} ")
    assert (mini.input.base, mini.cached.base, mini.output.base) == (Decimal("0.15"), Decimal("0.075"), Decimal("0.6"))
    # OpenAI bills no cache writes: a write is priced as input (its usage reports none).
    assert mini.cache_write == mini.input
    sonnet = book.rates("claude-sonnet-4-5", "messages")
    assert sonnet is not None
    assert (sonnet.input.base, sonnet.cached.base, sonnet.cache_write.base) == tuple(map(Decimal, ("3", "0.3", "3.75")))
    # Its long-context prices: more than 200k input tokens, and the whole request at them.
    assert sonnet.input.at(200_000) == Decimal(3) and sonnet.input.at(200_001) == Decimal(6)


@pytest.mark.parametrize(
    ("model", "api"),
    [
        ("llama-3-8b", "chat_completions"),  # a self-hosted model behind an OpenAI-compatible server
        ("claude-sonnet-4-5", "chat_completions"),  # Anthropic's model named at OpenAI's API: not OpenAI's to price
        ("gpt-4o-mini", "some_other_api"),
        (None, "chat_completions"),
        ("", "messages"),
    ],
)
def test_a_model_the_library_does_not_price_at_that_provider_is_unknown(model: str | None, api: str) -> None:
    assert PriceBook().rates(model, api) is None


def test_a_tier_applies_above_its_start() -> None:
    rate = Rate(Decimal(1), ((100, Decimal(2)), (1000, Decimal(4))))
    assert [rate.at(tokens) for tokens in (0, 100, 101, 1000, 1001)] == list(map(Decimal, (1, 1, 2, 2, 4)))


def test_the_cost_page_s_examples_set_the_same_prices(tmp_path: Path) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "cost.md").read_text()
    command = page.split("```bash\n", 1)[1].split("```", 1)[0]
    words = shlex.split(command.replace("\\\n", " "))
    assert words[:2] == ["compaction-proxy", "serve"]
    from_flags = settings_from_args(build_parser().parse_args(words[1:])).prices
    file = tmp_path / "proxy.yaml"
    file.write_text(page.split("```yaml\n", 1)[1].split("```", 1)[0])
    assert from_flags == load_settings(environ={}, config_file=file).prices
    assert set(from_flags) == {"llama-*", "gpt-4o"}
