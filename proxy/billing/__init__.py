"""The bill: what the provider billed through the proxy, against an estimate of the same requests sent direct.

Beside the request path: it reads the records a conversation's ledger keeps (`bill.Request`) and prices them
(`prices.PriceBook`: the operator's `prices` setting, else the `genai-prices` library, else tokens only), under each
provider's cache rules (`caching`). The bench bills its runs with it too (`bench.billing`).
"""

from proxy.billing.bill import Bill, Charge, Request, conversation_bill, refused_at, total
from proxy.billing.prices import PriceBook, Rates

__all__ = ["Bill", "Charge", "PriceBook", "Rates", "Request", "conversation_bill", "refused_at", "total"]
