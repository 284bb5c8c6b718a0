"""Typed keys for what the app and each request carry (aiohttp `AppKey` / `RequestKey`)."""

from __future__ import annotations

from aiohttp import web

from proxy.config import Settings
from proxy.pipeline.exchange import Compaction
from proxy.server.metrics import ProxyMetrics
from proxy.server.readiness import Readiness
from proxy.server.record import RequestRecord
from proxy.server.route_table import Route, RouteTable

SETTINGS = web.AppKey("settings", Settings)
"""The validated settings the app was created with."""

COMPACTION = web.AppKey("compaction", Compaction)
"""The compaction side: the pipeline deciding every compacted request (`PassThrough` without one)."""

METRICS = web.AppKey("metrics", ProxyMetrics)
"""The app's metrics; `app[METRICS].registry` is the Prometheus registry `/metrics` serves."""

READINESS = web.AppKey("readiness", Readiness)
"""Whether `/readyz` answers ready."""

ROUTES = web.AppKey("routes", RouteTable)
"""The upstreams and which requests each takes, each with its pooled client; present between startup and cleanup."""

ROUTE = web.RequestKey("route", Route)
"""The route the request took: its upstream client. Set before anything is sent upstream."""

RECORD = web.RequestKey("record", RequestRecord)
"""What the handlers learned about the request, for the access log and metrics."""
