"""The conversations' bills in the dashboard's JSON: one price book per app, its library's data loaded at start-up.

Each conversation's JSON carries its `bill` (`proxy.billing.Bill.as_dict`), and the list carries each listed
conversation's bill and their `total`. A bill covers the records the ledger keeps of a conversation (its last
`requests`: see `proxy.pipeline.ledger`); `dropped` in a conversation's JSON says how many older ones it leaves out.

The price library's data takes a second or two of CPU to load: it is loaded in a worker thread when the app starts,
never on the request path. A bill made before it is ready prices only the operator's `prices` (the library's models
are counted in tokens only) and says `"prices": "loading"`; after, `"prices": "loaded"`, or `"unavailable"` when the
library is not installed (the `billing` extra) or failed to load (logged). Bills of many records are
made in a worker thread too, like `/dashboard.json`'s figures: the event loop forwards requests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final

from aiohttp import web

from proxy.billing import PriceBook, conversation_bill, total
from proxy.billing.prices import PerMillion, preload
from proxy.pipeline.ledger import LedgerRecord
from proxy.server.background import running
from proxy.server.keys import SETTINGS
from proxy.server.logging import SERVER_LOGGER

log = logging.getLogger(SERVER_LOGGER)

TOTAL: Final = ""
"""The key of the total in `billed`'s answer (no conversation's id is empty)."""

IN_THREAD_RECORDS: Final = 64
"""Bills over more records than this are made in a worker thread: a record takes about 15 microseconds, so the
event loop is held a millisecond at most (the whole ledger, 128 conversations of 256 records, takes half a second)."""


class Prices:
    """The app's price book, and the one it uses while the library's data loads.

    :param overrides: The operator's `prices` setting.
    """

    def __init__(self, overrides: Mapping[str, PerMillion]) -> None:
        self._book = PriceBook(overrides)
        self._loading = PriceBook(overrides, library=False)
        self.state = "loading"

    def load(self) -> None:
        """Load the library's data (in a worker thread: a second or two of CPU), then price with it."""
        try:
            self.state = "loaded" if preload() else "unavailable"
        except Exception:  # a broken price library costs the bill its prices, never the proxy its start
            log.warning(
                "The price library (genai-prices) failed to load: bills price only the `prices` setting's models."
                " Reinstall the `billing` extra, or name your models' prices in `prices`.",
                exc_info=True,
            )
            self.state = "unavailable"

    def now(self) -> tuple[PriceBook, str]:
        """The book to price with now (without the library until its data is loaded), and the state it is of."""
        state = self.state  # read once: the loading thread may change it
        return self._book if state == "loaded" else self._loading, state


PRICES = web.AppKey("prices", Prices)
"""The app's prices; present while the app runs."""


def add_prices(app: web.Application) -> None:
    """Give the app its prices when the dashboard is on, the library's data loaded in a worker thread from start-up."""
    if app[SETTINGS].dashboard:
        app.cleanup_ctx.append(_loading)


async def _loading(app: web.Application) -> AsyncIterator[None]:
    prices = Prices(app[SETTINGS].prices)
    app[PRICES] = prices
    async with running(asyncio.to_thread(prices.load)):  # a load still running at cleanup finishes in its thread
        yield


async def billed(app: web.Application, records: Mapping[str, Sequence[LedgerRecord]]) -> dict[str, dict[str, Any]]:
    """Each conversation's bill for JSON by id, and their total under `TOTAL`: in a thread when there are many records.

    Each says whether the library's prices were in it (`prices`).
    """
    book, loaded = app[PRICES].now()
    state = {"prices": loaded}

    def made() -> dict[str, dict[str, Any]]:
        each = {conversation: conversation_bill(kept, book) for conversation, kept in records.items()}
        shown = {conversation: {**bill.as_dict(), **state} for conversation, bill in each.items()}
        return {**shown, TOTAL: {**total(each.values()).as_dict(), **state}}

    if sum(map(len, records.values())) > IN_THREAD_RECORDS:
        return await asyncio.to_thread(made)
    return made()
