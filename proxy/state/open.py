"""Choosing the state store from the `state_url` setting."""

from __future__ import annotations

from proxy.config import Settings
from proxy.state.base import StateStore
from proxy.state.memory import MemoryStore


def open_store(settings: Settings) -> StateStore:
    """The store `settings.state_url` names: `memory://` (the default) or Redis, for replicas.

    Redis URLs are `redis://host:port/db`, `rediss://` for TLS, or `unix://` for a socket.

    Redis is imported only when named, so memory-only users need neither the package nor its import time.

    :raises ValueError: If the URL's scheme names no store this build has.
    """
    url = settings.state_url
    if url.startswith("memory://"):
        return MemoryStore(
            max_entries=settings.state_max_conversations,
            ttl_seconds=settings.state_ttl_seconds,
            max_bytes=settings.state_max_bytes,
            offload_max_bytes=settings.state_offload_max_bytes,
        )
    if url.startswith(("redis://", "rediss://", "unix://")):
        try:
            from proxy.state.redis import RedisStore
        except ImportError as error:  # pragma: no cover - depends on the installed extras
            raise ValueError(
                "state_url names Redis but the redis package is not installed: pip install 'compaction-proxy[redis]'."
            ) from error
        return RedisStore(url, ttl_seconds=settings.state_ttl_seconds, ca_bundle=settings.state_ca_bundle)
    scheme = url.split("://", 1)[0]
    raise ValueError(f"state_url {scheme}:// is not supported; use memory://, redis://, rediss:// or unix://.")
