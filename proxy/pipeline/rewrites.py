"""Rewrite memory: each compaction is remembered and replayed on the next request that extends the same prefix.

The client keeps sending its whole, uncompacted history. The plan stored for the longest known prefix of what it
sent is reapplied, so the upstream sees exactly the rewritten prefix it saw last turn (provider prompt caches keep
hitting) and the engine only has to look at what is new. A new compaction is composed onto the replayed plan and
stored for the whole original request.

A replayed plan always opens with the request's leading block as the client sent it (`with_leading_block`): a plan
remembered before the block was protected, which cut or dropped part of it, does not carry the loss on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Final

from proxy.engine import EditPlan
from proxy.engine.grouping import with_leading_block
from proxy.engine.messages import Message, chain_keys
from proxy.engine.plan import Kept
from proxy.engine.strategies.offload import held_references
from proxy.pipeline.known_prefixes import DEFAULT_MAX_BYTES, KnownPrefixes, extended_keys
from proxy.state import StateStore
from proxy.state.base import latest_from

RESTORE_AFTER_MESSAGES: Final = 16
"""A rewrite found this many messages or more behind a request's head is stored again at the head.

Storing a plan costs work proportional to it (its size in memory, its encoding for Redis), so it is not done on
every turn; a lookup walks back at most this far to a stored plan, and the stored one's time to live is renewed as
the conversation goes on. Far below a Redis lookup's `scan_limit`."""


@dataclass(frozen=True)
class View:
    """The request as the upstream will see it before any new compaction: the remembered rewrite applied.

    :param messages: The upstream's view of the conversation.
    :param keys: The message keys of `messages`.
    :param meta: Per-message metadata (compaction markers of created messages), or None when nothing was rewritten.
    :param plan: The remembered plan extended over the whole original request (identity when none was remembered).
    :param original_chain: The chain of the original messages; its last element keys this request's rewrite.
    :param chain: The chain of `messages`, what the upstream is sent unless compaction changes it.
    :param held: The references of the offloaded results `messages` hold (a view extending another holds the same).
    """

    messages: list[Message]
    keys: list[bytes]
    meta: list[Mapping[str, Any]] | None
    plan: EditPlan
    original_chain: list[bytes]
    chain: list[bytes]
    held: tuple[str, ...] = ()

    @property
    def read_tool(self) -> bool:
        """Whether the conversation was sent with the read tool: it holds offloaded results, or held some before.

        The remembered plan says so (`EditPlan.read_tool`); a plan stored before it could still holds references.
        """
        return self.plan.read_tool or bool(self.held)

    @property
    def changed(self) -> bool:
        """Whether the upstream's view differs from what the client sent."""
        return self.meta is not None

    @property
    def changed_messages(self) -> list[Message] | None:
        """The upstream's view when it differs from what the client sent, else None (the client's bytes are sent)."""
        return self.messages if self.changed else None


@dataclass
class Keyed:
    """A request's original messages with their keys and hash chain.

    :param missed_at: The store's count of rewrites saved (`MemoryStore.rewrites_saved`) when a lookup over this whole
        chain found none: until another is saved, a request extending this one is looked up over its new part only.
    :param found_at: Where the lookup for this chain found its rewrite: a request extending it is looked up from there.
    """

    messages: list[Message]
    keys: list[bytes]
    chain: list[bytes]
    body_bytes: int
    missed_at: int | None = None
    found_at: int | None = None

    def extended(self, messages: list[Message], body_bytes: int) -> Keyed:
        """The keys of `messages`, which start with these messages: only the ones after them are hashed."""
        keys, chain = extended_keys(self.keys, self.chain, messages[len(self.keys) :])
        return Keyed(messages, keys, chain, body_bytes)


class RewriteMemory:
    """Finds, replays and stores the rewrites of each conversation, scoped by tenant.

    :param store: Where rewrites live (shared by replicas when it is Redis).
    :param enabled: False replays and stores nothing (every request is compacted afresh).
    :param memory_bytes: What the parsed messages of recent requests may hold, shared by the originals and their
        rewritten views (see `KnownPrefixes`).
    """

    def __init__(self, store: StateStore, *, enabled: bool = True, memory_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.store = store
        self.enabled = enabled
        self.prefixes = KnownPrefixes(max_bytes=memory_bytes // 2)
        self.view_prefixes = KnownPrefixes(max_bytes=memory_bytes // 2)

    def keyed(self, scope: bytes, original: list[Message], body_bytes: int) -> Keyed:
        """The original messages' keys and chain, hashing only what follows the remembered prefix (CPU work).

        :param body_bytes: The size of the body the messages came from, what remembering them is charged.
        """
        keys, chain = self.prefixes.keys(scope, original, body_bytes)
        return Keyed(original, keys, chain, body_bytes)

    async def find(self, scope: bytes, keyed: Keyed, known: Keyed | None = None) -> tuple[int, EditPlan] | None:
        """The rewrite stored for the longest known prefix, stored again at this request's head when older.

        :param known: The keys of a request this one extends. When a lookup over all of it found no rewrite and the
            store has saved none since, only the new part of the chain is looked up: the answer is the same.
        """
        if not self.enabled or not keyed.chain:
            return None
        saved = getattr(self.store, "rewrites_saved", None)
        start = len(known.chain) if known is not None and saved is not None and known.missed_at == saved else 0
        since = known.found_at if known is not None and not start else None
        found = await latest_from(partial(self.store.latest_rewrite, scope), keyed.chain, since, start)
        if found is None:
            keyed.missed_at = saved
            return None
        stored_at, stored = found
        plan = with_leading_block(stored.extended(len(keyed.messages)), keyed.messages)
        keyed.found_at = stored_at
        if len(keyed.messages) - (stored_at + 1) >= RESTORE_AFTER_MESSAGES:
            # Store it at this request's head, so later turns find it in a few steps.
            await self.store.save_rewrite(scope, keyed.chain[-1], plan)
            keyed.found_at = len(keyed.messages) - 1
        return stored_at, plan

    def view(self, scope: bytes, keyed: Keyed, plan: EditPlan | None) -> View:
        """The upstream's view: `plan` (already extended over the request) applied, or the original (CPU work)."""
        if plan is None:
            length = len(keyed.messages)
            return View(keyed.messages, keyed.keys, None, EditPlan.identity(length), keyed.chain, keyed.chain)
        meta: list[Mapping[str, Any]] = [{} if isinstance(entry, Kept) else entry.meta for entry in plan.entries]
        messages = plan.apply_messages(keyed.messages)
        # The rewritten view repeats turn after turn too, so its keys come from the remembered prefix as well.
        view_keys, view_chain = self.view_prefixes.keys(scope, messages, keyed.body_bytes)
        return View(messages, view_keys, meta, plan, keyed.chain, view_chain, held_references(meta))

    def extended_view(self, previous: View, keyed: Keyed, plan: EditPlan | None) -> View | None:
        """What `view` gives for a request that extends the one `previous` was made for, built from `previous`.

        Only the new messages are looked at: they are kept as they are, so the view is `previous` plus them. None when
        `plan` (what `find` gave for this request) is not `previous.plan` extended over them, because another rewrite
        was stored for this conversation since; `view` then gives the answer.
        """
        known, length = len(previous.original_chain), len(keyed.messages)
        if plan is None:
            if previous.changed:
                return None
            return View(keyed.messages, keyed.keys, None, previous.plan.extended(length), keyed.chain, keyed.chain)
        kept = len(previous.plan.entries)
        appended = tuple(Kept(index) for index in range(known, length))
        if (
            previous.meta is None
            or plan.source_length != length
            or plan.entries[kept:] != appended
            or plan.entries[:kept] != previous.plan.entries
        ):
            return None
        added_keys = keyed.keys[known:]
        return View(
            [*previous.messages, *keyed.messages[known:]],
            [*previous.keys, *added_keys],
            [*previous.meta, *({} for _ in added_keys)],
            plan,
            keyed.chain,
            [*previous.chain, *chain_keys(added_keys, start=previous.chain[-1])],
            previous.held,
        )

    def compacted_chain(self, scope: bytes, messages: list[Message], body_bytes: int) -> list[bytes]:
        """The chain of a freshly compacted view, remembered as the view the next turn will extend (CPU work).

        :param body_bytes: An upper bound on the view's size: the size of the original body.
        """
        _keys, chain = self.view_prefixes.keys(scope, messages, body_bytes)
        return chain

    async def remember(self, scope: bytes, view: View, compaction: EditPlan, *, read_tool: bool = False) -> None:
        """Compose a new compaction onto the replayed rewrite and store it for the whole original request.

        :param read_tool: The compacted request is sent with the read tool: the conversation keeps it from now on.
        """
        if view.original_chain and self.enabled:
            plan = view.plan.then(replace(compaction, read_tool=read_tool) if read_tool else compaction)
            await self.store.save_rewrite(scope, view.original_chain[-1], plan)
