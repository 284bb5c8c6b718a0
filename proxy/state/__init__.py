"""Per-conversation state the proxy remembers between requests: rewrite plans and usage anchors."""

from proxy.state.base import StateStore
from proxy.state.memory import MemoryStore
from proxy.state.open import open_store

__all__ = ["MemoryStore", "StateStore", "open_store"]
