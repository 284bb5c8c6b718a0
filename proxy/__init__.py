"""compaction-proxy: keeps long-running LLM conversations inside the model's context window.

Importing `proxy` is deliberately light: the engine lives in `proxy.engine` and the aiohttp server in
`proxy.server`, each imported only by whoever needs it.
"""

__version__ = "0.1.0"
