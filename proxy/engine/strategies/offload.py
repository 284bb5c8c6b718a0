"""Tool-result offloading: older large tool results move to a store and leave a reference the model can read back.

Pruning forgets: its placeholder can only ask the model to run the tool again, which costs a round trip and is wrong
for tools that are not idempotent. Offloading hands the full content to an `OffloadStore` and leaves, in place of
the result, a reference with a short preview (Haystack's pointer) or a digest of what it held (the proxy's, see
`proxy.engine.digest`); a read tool over the same store gives the content back when the model needs it. Lossless
compaction goes first, then offloading, and only then pruning, summarizing or dropping.

References are a hash of the content (`content_reference`), so compacting the same conversation twice, on any
replica, writes the same bytes (rewrite memory replays them and the provider's prompt cache keeps hitting), and two
identical results share one stored copy. An offloaded result carries `meta["context_compaction"]` and
`meta["tool_result_offloaded"]` (the references), which later strategies leave alone: pruning skips it, the sliding
window drops its step whole or not at all, and its reference sits at the head of the text a middle-out cut keeps.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.engine.digest import digest
from proxy.engine.messages import content_parts, content_text
from proxy.engine.plan import Created, EditPlan
from proxy.engine.strategies.base import Strategy, replace_until_target
from proxy.engine.strategies.tool_result_pruning import check_result_rules, newest_results
from proxy.engine.tool_results import answered_calls, holds_result
from proxy.engine.transcript import Transcript, created

logger = logging.getLogger("compaction_proxy.compaction")

OFFLOADED_META_KEY = "tool_result_offloaded"
"""Meta key of an offloaded result: the list of references its content went to (Haystack's key and shape)."""

DEFAULT_POINTER = "Tool result offloaded to text ({characters} characters) at '{reference}'. Preview: {preview}"
"""What stands in for an offloaded text, as Haystack writes it: `{characters}`, `{reference}` and `{preview}` (the
first `preview_chars` characters, with `...` when cut short) are substituted."""

REFERENCE_PREFIX = "offloaded-"


class OffloadStore(Protocol):
    """Where offloaded tool results live, called synchronously from the strategy (on a worker thread or inline).

    A store scoped to one tenant (or one Agent run) is what keeps one caller from reading another's results: the
    reference is a content hash, so it names the content but grants nothing by itself.
    """

    def put(self, content: str) -> str:
        """Keep `content` and return its reference: `content_reference(content)`, so replays write the same bytes.

        :raises Exception: Any failure; the strategy then leaves the result in the conversation.
        """
        ...

    def get(self, reference: str) -> str | None:
        """The content kept under `reference`, or None when this store does not hold it (expired, unknown)."""
        ...


def content_reference(content: str) -> str:
    """The deterministic reference of `content`: a prefix and 128 bits of its SHA-256, the same on every replica.

    SHA-256 rather than the engine's fast message hash: a reference is handed to a store shared by many
    conversations, and two different results must never be told apart by luck.
    """
    digest = hashlib.sha256(content.encode("utf-8", "surrogatepass")).hexdigest()
    return REFERENCE_PREFIX + digest[:32]


class MemoryOffloadStore:
    """An in-process `OffloadStore` bounded in bytes of content, forgetting the least recently used first.

    Thread-safe: the proxy compacts large requests on worker threads.

    :param max_bytes: How many UTF-8 bytes of content to hold; a single content larger than this is refused.
    :raises ValueError: If `max_bytes` is negative.
    """

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        if max_bytes < 0:
            raise ValueError(f"`max_bytes` must be at least 0, got {max_bytes}.")
        self.max_bytes = max_bytes
        self._contents: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def bytes_held(self) -> int:
        """The UTF-8 bytes of content held now."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._contents)

    def put(self, content: str) -> str:
        """Keep `content` (the same content is kept once) and return its reference.

        :raises ValueError: If the content alone is larger than `max_bytes`.
        """
        size = len(content.encode("utf-8", "surrogatepass"))
        if size > self.max_bytes:
            raise ValueError(f"A {size}-byte result does not fit a store of {self.max_bytes} bytes.")
        reference = content_reference(content)
        with self._lock:
            if reference in self._contents:
                self._contents.move_to_end(reference)
                return reference
            self._contents[reference] = (content, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, (_, evicted) = self._contents.popitem(last=False)
                self._bytes -= evicted
        return reference

    def get(self, reference: str) -> str | None:
        """The content kept under `reference`, or None."""
        with self._lock:
            held = self._contents.get(reference)
            if held is None:
                return None
            self._contents.move_to_end(reference)
            return held[0]


class StagingOffloadStore:
    """An `OffloadStore` that holds what planning wrote, for the caller to persist afterwards in one batch.

    For a front end whose own store is asynchronous (the proxy's state store): compaction runs inline on the event
    loop or on a worker thread, and a `put` waiting on the loop would stall or deadlock it. Planning puts here, which
    cannot fail; the caller then persists `pending()` under the tenant's scope before forwarding, and treats a failed
    persist as any other state-store failure.
    """

    def __init__(self) -> None:
        self._pending: dict[str, str] = {}
        self._lock = threading.Lock()

    def put(self, content: str) -> str:
        """Hold `content` until it is persisted and return its reference."""
        reference = content_reference(content)
        with self._lock:
            self._pending.setdefault(reference, content)
        return reference

    def get(self, reference: str) -> str | None:
        """The content held under `reference` (only what was put here), or None."""
        with self._lock:
            return self._pending.get(reference)

    def pending(self) -> dict[str, str]:
        """Every content put so far, by reference, in the order it was first put."""
        with self._lock:
            return dict(self._pending)


@dataclass(frozen=True)
class Offloaded:
    """Where one result's content went and the text that stands in for it."""

    references: tuple[str, ...]
    pointer: str


class ToolResultOffload(Strategy):
    """Moves older large tool results to a store, oldest first, until the conversation reaches the target.

    Each result is replaced in place, so every call keeps its answer; the newest `min_keep_steps` tool-calling steps
    are never touched. A result is left as it is when it is small, empty, not all text (images and files stay), was
    already rewritten by a compaction, or when writing it fails (a warning is logged).

    :param store: Where the content goes.
    :param min_keep_steps: How many of the newest tool-calling steps keep their results. At least 1.
    :param min_tokens: Only results larger than this many tokens are offloaded.
    :param preview_chars: How many leading characters of the content the reference shows.
    :param pointer: The stand-in text (see `DEFAULT_POINTER` for its placeholders).
    :param with_digest: The stand-in is followed by a digest of the result (`proxy.engine.digest`: the call, the
        size, the telling lines), so the model knows what the reference holds before reading it back. Off by
        default, as Haystack's pointer is; the proxy turns it on.
    :raises ValueError: If `min_keep_steps` is below 1, or `min_tokens` or `preview_chars` is negative.
    """

    name = "tool_result_offloading"

    def __init__(
        self,
        store: OffloadStore,
        *,
        min_keep_steps: int = 1,
        min_tokens: int = 200,
        preview_chars: int = 200,
        pointer: str = DEFAULT_POINTER,
        with_digest: bool = False,
    ) -> None:
        check_result_rules(min_keep_steps, min_tokens)
        if preview_chars < 0:
            raise ValueError(f"`preview_chars` must be at least 0, got {preview_chars}.")
        self.store = store
        self.min_keep_steps = min_keep_steps
        self.min_tokens = min_tokens
        self.preview_chars = preview_chars
        self.pointer = pointer
        self.with_digest = with_digest

    async def plan_async(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        """`plan` on a worker thread: store writes are I/O and must not hold an event loop."""
        return await asyncio.to_thread(self.plan, transcript, target_tokens)

    def _propose(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        protected = newest_results(transcript, self.min_keep_steps)
        candidates = (
            index for index in range(len(transcript)) if index not in protected and self._offloadable(transcript, index)
        )
        calls = answered_calls(transcript) if self.with_digest else {}
        return replace_until_target(
            transcript, target_tokens, candidates, lambda index, _excess: self._stand_in(transcript, index, calls)
        )

    def _offloadable(self, transcript: Transcript, index: int) -> bool:
        meta = transcript.meta[index]
        return (
            holds_result(transcript, index)
            and not meta.get(OFFLOADED_META_KEY)
            and transcript.tokens(index) > self.min_tokens
        )

    def _stand_in(self, transcript: Transcript, index: int, calls: Mapping[int, Mapping[str, Any]]) -> Created | None:
        offloaded = self.offload(transcript, index)
        if offloaded is None:
            return None
        message = transcript.messages[index]
        pointer = offloaded.pointer + ("\n" + digest(message, calls.get(index)) if self.with_digest else "")
        return created(
            {**message, "content": pointer},
            self.name,
            replacing=index,
            base_meta={**transcript.meta[index], OFFLOADED_META_KEY: list(offloaded.references)},
            original_tokens=transcript.tokens(index),
        )

    def offload(self, transcript: Transcript, index: int) -> Offloaded | None:
        """Write the content of the result at `index` to the store; None leaves the result in the conversation.

        Front ends with richer results than text (the Haystack hook's images and files) override this.
        """
        message = transcript.messages[index]
        if any(part.get("type") != "text" for part in content_parts(message)):
            return None
        text = content_text(message)
        if not text:
            return None
        try:
            reference = self.store.put(text)
        except Exception as error:
            logger.warning(
                "Offloading a tool result to %s failed (%s); the result stays in the conversation.",
                type(self.store).__name__,
                type(error).__name__,
            )
            return None
        return Offloaded((reference,), self.pointer_text(reference, text))

    def pointer_text(self, reference: str, text: str) -> str:
        """The stand-in for `text` kept under `reference`."""
        preview = text[: self.preview_chars] + ("..." if len(text) > self.preview_chars else "")
        return (
            self.pointer.replace("{characters}", str(len(text)))
            .replace("{reference}", reference)
            .replace("{preview}", preview)
        )


def offloaded_references(meta: Mapping[str, object]) -> list[str]:
    """The references an offloaded message's meta lists (empty for any other message)."""
    references = meta.get(OFFLOADED_META_KEY)
    if isinstance(references, str):
        return [references]
    return [reference for reference in references if isinstance(reference, str)] if isinstance(references, list) else []


def held_references(meta: Sequence[Mapping[str, object]] | None) -> tuple[str, ...]:
    """The references of the offloaded results among messages with this metadata, in order, each once."""
    if not meta:
        return ()
    return tuple(dict.fromkeys(reference for entry in meta if entry for reference in offloaded_references(entry)))
