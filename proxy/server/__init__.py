"""The aiohttp reverse proxy: forwards every request to the configured upstream.

Chat completions pass through a `ChatCompaction` (see `proxy.pipeline.exchange`) on their way.

Importing this package imports aiohttp; `import proxy` alone does not.
"""

from proxy.server.app import create_app, runner_options
from proxy.server.keys import CHAT, METRICS, READINESS, SETTINGS, UPSTREAM
from proxy.server.metrics import ProxyMetrics

__all__ = ["CHAT", "METRICS", "READINESS", "SETTINGS", "UPSTREAM", "ProxyMetrics", "create_app", "runner_options"]
