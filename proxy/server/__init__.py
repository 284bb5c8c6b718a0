"""The aiohttp reverse proxy: forwards every request to the configured upstream.

Requests of the wire formats the proxy compacts pass through a `Compaction` (see `proxy.pipeline.exchange`) on
their way.

Importing this package imports aiohttp; `import proxy` alone does not.
"""

from proxy.server.app import create_app, runner_options
from proxy.server.keys import COMPACTION, METRICS, READINESS, ROUTES, SETTINGS
from proxy.server.metrics import ProxyMetrics

__all__ = ["COMPACTION", "METRICS", "READINESS", "ROUTES", "SETTINGS", "ProxyMetrics", "create_app", "runner_options"]
