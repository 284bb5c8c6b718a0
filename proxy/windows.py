"""Context windows of the models the proxy is likely to see, and how a request's window is resolved.

The table holds each family's total context window (prompt plus reply) in tokens, matched by the longest model-name
prefix, so dated snapshots (`gpt-4o-2024-08-06`) and provider prefixes (`openai/gpt-4o`) resolve too. Operators
override it per model in config, clients per request with `X-Context-Window`, and the proxy learns a model's window
from an overflow error that states it: for the tenant that got the error only, and never below what the provider has
already shown to fit for that tenant and model. A window the upstream itself reports (`proxy.discovery`) ranks below
what operators, clients and errors said and above the table, which only guesses from the model's name.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from proxy.engine.bounded import BoundedCache
from proxy.names import name_key, shown

logger = logging.getLogger("compaction_proxy.compaction")

MAX_LEARNED: Final = 4096
"""(tenant, model) pairs whose learned window, and whose largest answered request, are remembered."""

MAX_CACHED_NAME: Final = 256
"""Longest model name whose table windows are remembered (see `ContextWindows`)."""

KNOWN_CONTEXT_WINDOWS: Mapping[str, int] = {
    # OpenAI
    "gpt-5": 400_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.5": 128_000,
    "gpt-4o": 128_000,
    "chatgpt-4o": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-4-1106": 128_000,
    "gpt-4-0125": 128_000,
    "gpt-4-32k": 32_768,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "o1-mini": 128_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "gpt-oss": 131_072,
    # Common OpenAI-compatible open models
    "llama-3.1": 131_072,
    "llama-3.2": 131_072,
    "llama-3.3": 131_072,
    "meta-llama/llama-3.1": 131_072,
    "meta-llama/llama-3.3": 131_072,
    "llama3": 8_192,
    "mistral-large": 131_072,
    "mistral-small": 32_768,
    "mixtral-8x7b": 32_768,
    "qwen2.5": 32_768,
    "qwen3": 40_960,
    "deepseek-chat": 65_536,
    "deepseek-reasoner": 65_536,
    "gemma-3": 131_072,
    # Anthropic (platform.claude.com "Context windows": the models named there have 1M tokens, the others 200k;
    # Sonnet 4 and 4.5 reach 1M with a beta header, see `proxy.formats.anthropic.tokens.window_for`)
    "claude": 200_000,
    "claude-opus-4-6": 1_000_000,
    "claude-opus-4-7": 1_000_000,
    "claude-opus-4-8": 1_000_000,
    "claude-sonnet-4-6": 1_000_000,
    "claude-opus-5": 1_000_000,
    "claude-sonnet-5": 1_000_000,
    "claude-haiku-5-5": 1_000_000,
    "claude-fable-5": 1_000_000,
    "claude-mythos-5": 1_000_000,
    "gemini-2": 1_048_576,
}


class WindowSource(StrEnum):
    """Where a request's window came from, strongest first (the `X-Compaction-Window-Source` response header)."""

    REQUEST = "request"
    """The client's `X-Context-Window` header."""
    LEARNED = "learned"
    """An overflow error the upstream answered this tenant with: the deployment's own refusal beats any belief."""
    CONFIGURED = "configured"
    """The operator's `context_windows`."""
    DISCOVERED = "discovered"
    """What the upstream reports about the model it serves (`proxy.discovery`)."""
    TABLE = "table"
    """The shipped table, by model name."""
    DEFAULT = "default"
    """`default_context_window`."""


@dataclass(frozen=True)
class Window:
    """A request's context window in tokens and where it came from."""

    tokens: int
    source: WindowSource


def table_window(model: str | None, table: Mapping[str, int] = KNOWN_CONTEXT_WINDOWS) -> int | None:
    """The window of the longest table entry that prefixes the model name, with or without a provider prefix."""
    if not model:
        return None
    name = model.lower()
    candidates = (name, name.rsplit("/", 1)[-1])
    best: tuple[int, int] | None = None
    for candidate in candidates:
        for prefix, window in table.items():
            if candidate.startswith(prefix.lower()) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), window)
    return best[1] if best else None


class ContextWindows:
    """Resolves the context window for a request: per request, learned, configured, discovered, shipped, default.

    :param configured: Per-model overrides from the proxy's settings (exact name or prefix).
    :param default: The window for models nobody knows, or None to leave their requests uncompacted.
    :param max_learned: How many (tenant, model) pairs' learned windows and largest fits to remember.
    """

    def __init__(
        self, configured: Mapping[str, int] | None = None, default: int | None = None, max_learned: int = MAX_LEARNED
    ) -> None:
        self.configured = dict(configured or {})
        self._learned: BoundedCache[bytes, int] = BoundedCache(max_learned)
        self._fits: BoundedCache[bytes, int] = BoundedCache(max_learned)
        self._tables: BoundedCache[str, tuple[Window | None, Window | None]] = BoundedCache(max_learned)
        self._default = Window(default, WindowSource.DEFAULT) if default else None
        """The window of a model nobody knows: made once, as the table's are (a `Window` is never changed)."""

    def resolve_window(
        self,
        model: str | None,
        requested: int | None = None,
        tenant: bytes = b"",
        discovered: int | None = None,
        *,
        shipped: int | None = None,
    ) -> Window | None:
        """The window for `model` and its source, the strongest first (see `WindowSource`).

        :param discovered: What the upstream reported for the model, if anything.
        :param shipped: The window the request's wire format knows for it (a header's opt-in), in place of the
            shipped table's.
        """
        if requested is not None and requested > 0:
            return Window(requested, WindowSource.REQUEST)
        # Most processes never learn a window: an empty table is not looked up (nor the model's key hashed).
        learned = self._learned.get(_key(tenant, model)) if model and len(self._learned) else None
        if learned is not None:
            return Window(learned, WindowSource.LEARNED)
        configured, table = self._in_tables(model)
        if configured is not None:
            return configured
        if discovered:
            return Window(discovered, WindowSource.DISCOVERED)
        if shipped:
            return Window(shipped, WindowSource.TABLE)
        return table if table is not None else self._default

    def _in_tables(self, model: str | None) -> tuple[Window | None, Window | None]:
        """The configured and the shipped window of `model`: each table is walked once per model name, not per request.

        Only names up to `MAX_CACHED_NAME` characters are remembered, so a client's huge model names cost no memory.
        """
        if not model or len(model) > MAX_CACHED_NAME:
            return self._table_windows(model)
        found = self._tables.get(model)
        if found is None:
            found = self._table_windows(model)
            self._tables.put(model, found)
        return found

    def _table_windows(self, model: str | None) -> tuple[Window | None, Window | None]:
        """The configured and the shipped window of `model`, walking the tables."""
        configured, table = table_window(model, self.configured), table_window(model)
        return (
            Window(configured, WindowSource.CONFIGURED) if configured else None,
            Window(table, WindowSource.TABLE) if table else None,
        )

    def learn(self, model: str | None, window: int, tenant: bytes = b"") -> bool:
        """Remember a window an overflow error stated, for this tenant only.

        :returns: Whether it was learned: not when the provider already answered a larger request for this tenant
            and model (the error then says less than what is known to fit).
        """
        if not model or window <= 0:
            return False
        key = _key(tenant, model)
        fitted = self._fits.get(key)
        if fitted is not None and window < fitted:
            return False
        if self._learned.get(key) != window:
            logger.info(
                "Learned from the upstream's overflow error that model %r has a context window of %d tokens, for"
                " this caller and this process; it comes before context_windows and the shipped table.",
                shown(model),
                window,
            )
        self._learned.put(key, window)
        return True

    def fitted(self, model: str | None, tokens: int, tenant: bytes = b"") -> None:
        """Note that the provider answered a request of `tokens` (prompt plus reply) for this tenant and model."""
        if not model or tokens <= 0:
            return
        key = _key(tenant, model)
        if tokens > (self._fits.get(key) or 0):
            self._fits.put(key, tokens)


def _key(tenant: bytes, model: str) -> bytes:
    """A fixed-size key for a tenant's model, whatever the length of the name the client chose."""
    return tenant + name_key(model)


class UnknownModels:
    """Says once per model (of a bounded many) that no window is known for it, so its requests go uncompacted."""

    def __init__(self) -> None:
        self._logged: BoundedCache[bytes, bool] = BoundedCache(MAX_LEARNED)

    def log(self, model: str | None) -> None:
        """Log that `model` has no known window, unless that was said already."""
        key = name_key(model)
        if self._logged.get(key) is None:
            self._logged.put(key, True)
            logger.warning(
                "No context window is known for model %r: its requests are forwarded uncompacted. Set "
                "context_windows in the config, default_context_window, or send X-Context-Window.",
                shown(model) or "(no model)",
            )
