"""References between tool results: an older result a later one makes redundant becomes a pointer to that later call.

`ResultReferences` is the shared machinery of `duplicate_results` and `superseded_results`: results are grouped by a
key (their content, or their tool and arguments), and each older member of a group becomes a short reference to the
newest member that still holds the tool's output. A reference is marked with the call id it points to
(`REFERS_TO`), which is how later compactions, replayed turn after turn by rewrite memory, find it again.

A reference must always point to a result that is still there. Two rules keep it so:

- when a referenced result itself becomes a reference to a newer one, the references to it move on to that one;
- when any other strategy removes, prunes or cuts a referenced result, `dangling_references` (run by the chain after
  every strategy) turns the references to it into the pruning placeholder: "call the tool again". An offloaded
  result still counts as there: its pointer says how to read the content back.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Hashable, Mapping
from typing import Any

from proxy.engine.plan import Created, EditPlan, Entry, Kept
from proxy.engine.strategies.base import Strategy, replace_until_target
from proxy.engine.strategies.offload import OFFLOADED_META_KEY
from proxy.engine.strategies.tool_result_pruning import DEFAULT_PLACEHOLDER
from proxy.engine.tool_results import answered_calls, holds_result, result_tool_name
from proxy.engine.transcript import Transcript, created

REFERS_TO = "refers_to"
"""Marker detail of a reference: the `tool_call_id` of the later result it points to."""


class ResultReferences(Strategy):
    """Replaces older tool results with a reference to the newest result of the same group, oldest first.

    Only results answering a call with a unique id are grouped, so every reference names exactly one result. A
    replacement is made only when the reference is smaller than what it replaces, and only until the target is met.

    :param reference: The text left in place of an older result; `{tool_name}` and `{call_id}` name the later call.
    """

    def __init__(self, reference: str) -> None:
        self.reference = reference

    @abstractmethod
    def _key(self, transcript: Transcript, index: int, call: Mapping[str, Any] | None) -> Hashable | None:
        """The group of the result at `index` (answering `call`), or None to leave it out."""

    def _moves(self, transcript: Transcript, index: int, key: Hashable, call: Mapping[str, Any] | None) -> bool:
        """Whether the reference at `index`, whose result becomes a reference into group `key`, may follow it there.

        True for this strategy's own references (what made them true still holds for the group's newest result);
        the others give way to a placeholder instead.
        """
        return transcript.created_by(index, self.name)

    def _propose(self, transcript: Transcript, target_tokens: int) -> EditPlan | None:
        calls = answered_calls(transcript)
        positions = _unique_result_positions(transcript)
        keys, newest = self._groups(transcript, positions, calls)
        pointing = _references_by_target(transcript, positions)

        def stand_in(index: int, _excess: int) -> Created | None:
            latest = newest[keys[index]]
            return None if latest == index else self._reference(transcript, index, latest, calls)

        def moved_along(index: int) -> list[Created]:
            latest = newest[keys[index]]
            return [
                self._reference(transcript, earlier, latest, calls)
                for earlier in pointing.get(index, ())
                if self._moves(transcript, earlier, keys[index], calls.get(earlier))
            ]

        # Oldest first, as pruning goes: the newest copies, next to what the model did with them, stay longest.
        return replace_until_target(transcript, target_tokens, sorted(keys), stand_in, moved_along)

    def _groups(
        self, transcript: Transcript, positions: Mapping[str, int], calls: Mapping[int, Mapping[str, Any]]
    ) -> tuple[dict[int, Hashable], dict[Hashable, int]]:
        """Each groupable result's key, and each key's newest result."""
        keys: dict[int, Hashable] = {}
        newest: dict[Hashable, int] = {}
        for index in positions.values():
            if holds_result(transcript, index):
                key = self._key(transcript, index, calls.get(index))
                if key is not None:
                    keys[index] = key
                    newest[key] = max(index, newest.get(key, index))
        return keys, newest

    def _reference(
        self, transcript: Transcript, index: int, latest: int, calls: Mapping[int, Mapping[str, Any]]
    ) -> Created:
        later = transcript.messages[latest]
        call_id = str(later["tool_call_id"])
        text = self.reference.replace("{tool_name}", result_tool_name(later, calls.get(latest)))
        text = text.replace("{call_id}", call_id)
        return created(
            {**transcript.messages[index], "content": text},
            self.name,
            replacing=index,
            base_meta=transcript.meta[index],
            **{REFERS_TO: call_id},
        )


def dangling_references(transcript: Transcript, strategy: str) -> EditPlan | None:
    """A plan turning each reference whose result is gone into the pruning placeholder; None when none is.

    Gone means removed, pruned or cut by `strategy`, which the new placeholders are marked with.
    """
    positions: dict[str, int] | None = None
    calls: dict[int, Mapping[str, Any]] | None = None
    entries: list[Entry] = [Kept(index) for index in range(len(transcript))]
    changed = False
    for index in range(len(transcript)):
        marker = transcript.marker(index)
        if marker is None or REFERS_TO not in marker:
            continue
        if positions is None or calls is None:
            positions, calls = _unique_result_positions(transcript), answered_calls(transcript)
        if _target(transcript, index, positions) is not None:
            continue
        message = transcript.messages[index]
        text = DEFAULT_PLACEHOLDER.replace("{tool_name}", result_tool_name(message, calls.get(index)))
        entries[index] = created(
            {**message, "content": text}, strategy, replacing=index, base_meta=transcript.meta[index]
        )
        changed = True
    return EditPlan(len(transcript), tuple(entries)) if changed else None


def _references_by_target(transcript: Transcript, positions: Mapping[str, int]) -> dict[int, list[int]]:
    """The references already in the transcript, by the result each points to."""
    pointing: dict[int, list[int]] = {}
    for index in range(len(transcript)):
        target = _target(transcript, index, positions)
        if target is not None:
            pointing.setdefault(target, []).append(index)
    return pointing


def _target(transcript: Transcript, index: int, positions: Mapping[str, int]) -> int | None:
    """The later result the reference at `index` points to, when it is there and holds or offloaded the output."""
    marker = transcript.marker(index)
    call_id = marker.get(REFERS_TO) if marker is not None else None
    target = positions.get(call_id) if isinstance(call_id, str) else None
    if target is None or target <= index:
        return None
    # An offloaded result still says how to read the content back, so a reference to it still leads somewhere.
    readable = holds_result(transcript, target) or bool(transcript.meta[target].get(OFFLOADED_META_KEY))
    return target if readable else None


def _unique_result_positions(transcript: Transcript) -> dict[str, int]:
    """Where each tool result answering a call id no other result answers is, by that id."""
    positions: dict[str, int] = {}
    repeated: set[str] = set()
    for index, message in enumerate(transcript.messages):
        call_id = message.get("tool_call_id")
        if transcript.role(index) == "tool" and isinstance(call_id, str) and call_id:
            if call_id in positions:
                repeated.add(call_id)
            positions[call_id] = index
    for call_id in repeated:
        del positions[call_id]
    return positions
