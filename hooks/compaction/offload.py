"""`ToolResultOffloadCompactor`: Haystack's offload compactor, planned by the engine's `ToolResultOffload` strategy.

The engine decides which results go (oldest first, never the newest steps, never one already rewritten) and how far;
what goes where is Haystack's: each result's content blocks are written to a Haystack `ToolResultStore` with
Haystack's own helpers, so keys, references, the pointer text and the warnings are exactly those of
`haystack.hooks.compaction.ToolResultOffloadCompactor`, and a read tool over the same store reads them back.

Keys are a hash of the content rather than Haystack's random suffix: compacting the same conversation again writes
the same files (and the same pointer), and two runs sharing a store still never overwrite each other's different
results.
"""

from __future__ import annotations

from typing import Any, Self

from haystack.core.serialization import default_from_dict, default_to_dict
from haystack.hooks.tool_result_offloading.types import ToolResultStore
from haystack.hooks.tool_result_offloading.utils import (
    _content_block_payload,
    _offloadable_content_blocks,
    _offloaded_message,
)
from haystack.utils.deserialization import deserialize_component_inplace

from hooks.compaction.compactors import EngineCompactor
from hooks.compaction.convert import original_message
from proxy.engine import Strategy, ToolResultOffload, Transcript
from proxy.engine.strategies.offload import OFFLOADED_META_KEY, REFERENCE_PREFIX, Offloaded, content_reference


class ToolResultStoreAdapter:
    """The engine's `OffloadStore` over a Haystack `ToolResultStore`: text in, the store's reference out.

    :param store: The Haystack store (`FileSystemToolResultStore` or any other following its protocol).
    """

    def __init__(self, store: ToolResultStore) -> None:
        self.store = store

    def put(self, content: str) -> str:
        """Write `content` under a key derived from its hash and return the store's reference."""
        return self.store.write(key=f"compacted_{_digest(content)}.txt", content=content)

    def get(self, reference: str) -> str | None:
        """The text the store holds under `reference`, or None when it holds none (or holds bytes)."""
        try:
            content = self.store.read(reference)
        except Exception:
            return None
        return content if isinstance(content, str) else None


class HaystackToolResultOffload(ToolResultOffload):
    """The engine's offload strategy writing each result's Haystack content blocks (text, images, files) to the store.

    The engine sees OpenAI dicts; the blocks, the error flag and the tool's name are read from the `ChatMessage` the
    dict was converted from. A dict no cache converted is offloaded as its text.
    """

    def __init__(self, store: ToolResultStore, *, min_keep_steps: int, min_tokens: int, preview_chars: int) -> None:
        super().__init__(
            ToolResultStoreAdapter(store),
            min_keep_steps=min_keep_steps,
            min_tokens=min_tokens,
            preview_chars=preview_chars,
        )
        self.result_store = store

    def offload(self, transcript: Transcript, index: int) -> Offloaded | None:
        """Write the result's blocks as Haystack does; None leaves errors, empty results and unstorable content."""
        message = original_message(transcript.messages[index])
        if message is None:
            return super().offload(transcript, index)
        result = message.tool_call_result
        if result is None or result.error:
            return None
        blocks = _offloadable_content_blocks(result=result, store=self.result_store)
        if blocks is None:
            return None
        digest = _digest("\0".join(_content_block_payload(block) for block in blocks))
        offloaded = _offloaded_message(
            message=message,
            content_blocks=blocks,
            store=self.result_store,
            key_prefix=f"compacted_{result.origin.tool_name}_{digest}",
            preview_chars=self.preview_chars,
        )
        if offloaded is None or offloaded.tool_call_result is None:
            return None
        return Offloaded(tuple(offloaded.meta[OFFLOADED_META_KEY]), str(offloaded.tool_call_result.result))


class ToolResultOffloadCompactor(EngineCompactor):
    """Writes older tool results to a `ToolResultStore` and leaves a reference with a short preview in their place.

    A drop-in for `haystack.hooks.compaction.ToolResultOffloadCompactor`: same parameters, defaults, references and
    serialization. Every tool call keeps its result; the model reads the full output back with a read tool over the
    same store. Runs alone, first in a `ChainCompactor` (offload before pruning, so nothing is forgotten), or inside
    Haystack's own `CompactionHook`.

    ```python
    from haystack.hooks.tool_result_offloading import FileSystemToolResultStore
    from hooks.compaction import CompactionHook, ToolResultOffloadCompactor

    store = FileSystemToolResultStore(root="tool_results")
    hook = CompactionHook(compactor=ToolResultOffloadCompactor(store=store), context_window=128_000)
    ```

    The compactor always writes to the store it was created with: in a multi-user server give each run its own
    compactor and store, so users never read each other's results.
    """

    def __init__(
        self, store: ToolResultStore, *, min_keep_steps: int = 1, min_tokens: int = 200, preview_chars: int = 200
    ) -> None:
        """Initialize the compactor.

        :param store: Where offloaded results are written. Image and file results are written only to a store that
            sets `supports_binary_content`; otherwise they stay in the conversation. A result whose write fails stays
            too, and a warning is logged.
        :param min_keep_steps: How many of the newest tool-calling Agent steps keep their results. At least 1.
        :param min_tokens: Only results larger than this many tokens are offloaded.
        :param preview_chars: How many leading characters of each offloaded text the reference shows. Images and files
            are described by MIME type and size instead.
        :raises ValueError: If `min_keep_steps` is less than 1, or `min_tokens` or `preview_chars` is negative.
        """
        self.store = store
        self.min_keep_steps = min_keep_steps
        self.min_tokens = min_tokens
        self.preview_chars = preview_chars
        self.strategies()

    def strategies(self) -> list[Strategy]:
        """The engine's offload strategy with these settings, writing to this store."""
        return [
            HaystackToolResultOffload(
                self.store,
                min_keep_steps=self.min_keep_steps,
                min_tokens=self.min_tokens,
                preview_chars=self.preview_chars,
            )
        ]

    def to_dict(self) -> dict[str, Any]:
        """Serialize the compactor, including its store.

        :returns: A dictionary representation of the compactor.
        """
        return default_to_dict(
            self,
            store=self.store.to_dict(),
            min_keep_steps=self.min_keep_steps,
            min_tokens=self.min_tokens,
            preview_chars=self.preview_chars,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Deserialize the compactor, reconstructing its store.

        :param data: A dictionary representation produced by `to_dict`.
        :returns: The deserialized compactor.
        """
        init_params = data.get("init_parameters", {})
        if init_params.get("store") is not None:
            deserialize_component_inplace(init_params, key="store")
        return default_from_dict(cls, data)


def _digest(content: str) -> str:
    """The hex digest part of the content's engine reference, for building store keys."""
    return content_reference(content).removeprefix(REFERENCE_PREFIX)
