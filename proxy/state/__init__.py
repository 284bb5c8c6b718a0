"""Per-conversation state the proxy remembers between requests: rewrite plans and usage anchors."""

from proxy.state.base import StateStore
from proxy.state.memory import MemoryStore

__all__ = ["MemoryStore", "StateStore"]
