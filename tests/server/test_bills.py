"""The app's prices: until the price library's data is loaded (in a worker thread from start-up), a bill prices the
operator's models only and says so, never waiting for it."""

from __future__ import annotations

from proxy.config.prices import ModelPrices
from proxy.server.bills import Prices


def test_until_the_library_is_loaded_bills_price_only_the_operator_s_models() -> None:
    prices = Prices({"mine": ModelPrices(input=1, output=2)})
    book, state = prices.now()
    assert state == "loading"
    assert book.rates("gpt-4o-mini", "chat_completions") is None
    assert book.rates("mine", "chat_completions") is not None
    prices.load()
    book, state = prices.now()
    assert state == "loaded"
    assert book.rates("gpt-4o-mini", "chat_completions") is not None
    assert book.rates("mine", "chat_completions") is not None
