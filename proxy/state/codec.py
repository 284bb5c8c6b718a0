"""A compact, versioned byte form of `EditPlan`, for state stores that keep plans outside the process (Redis).

The form is one orjson array::

    [1, source_length, [entry, ...]]

where each entry is either a run of kept source indices, `[start, stop]` (stop exclusive, so a plan that keeps 500
messages in order costs a few bytes, not 500 numbers), or a created message, `{"m": message, "t": meta}` plus
`"r": index` when it replaces an original. A plan whose conversation was sent with the read tool
(`EditPlan.read_tool`) has a fourth element, `{"read_tool": true}`; one without it (every record written before it
existed) was not. The leading `1` is the format version: a reader meeting a version it does not know raises
`PlanDecodeError`, and stores treat that record as absent rather than misapply it.

Created messages keep their key order through the round trip: the proxy forwards them as they come back, and two
replicas must send the upstream the same bytes.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import orjson

from proxy.engine.plan import Created, EditPlan, Entry, Kept

FORMAT_VERSION = 1
"""The version written first in every encoded plan."""

READ_TOOL_FIELD = "read_tool"
"""The key of the fourth element saying the plan's conversation was sent with the read tool."""


class PlanDecodeError(ValueError):
    """The bytes are not a plan this build can read (corrupt, or written by a newer format version)."""


def _default(value: object) -> object:
    """Serialize the mappings and sequences orjson does not know natively (e.g. `MappingProxyType`)."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"cannot encode a {type(value).__name__} in a plan")


def _encode_created(entry: Created) -> dict[str, Any]:
    item: dict[str, Any] = {"m": entry.message, "t": entry.meta}
    if entry.replaces is not None:
        item["r"] = entry.replaces
    return item


def encode_entries(entries: tuple[Entry, ...]) -> list[Any]:
    """The wire form of `entries`: consecutive ascending kept indices folded into `[start, stop]` runs."""
    encoded: list[Any] = []
    run: list[int] | None = None
    for entry in entries:
        if isinstance(entry, Kept):
            if run is not None and run[1] == entry.index:
                run[1] += 1
            else:
                run = [entry.index, entry.index + 1]
                encoded.append(run)
        else:
            run = None
            encoded.append(_encode_created(entry))
    return encoded


def encode_plan(plan: EditPlan) -> bytes:
    """`plan` as bytes (see the module docstring for the form)."""
    document: list[Any] = [FORMAT_VERSION, plan.source_length, encode_entries(plan.entries)]
    if plan.read_tool:
        document.append({READ_TOOL_FIELD: True})
    return orjson.dumps(document, default=_default)


def encode_entry(entry: Entry) -> bytes:
    """One entry's wire form, on its own: what `supersedes` compares entries by."""
    if isinstance(entry, Kept):
        return orjson.dumps(entry.index)
    return orjson.dumps(_encode_created(entry), default=_default)


def decode_plan(data: bytes, source_length: int) -> EditPlan:
    """The plan `encode_plan` wrote for a prefix of `source_length` messages (the prefix its key names).

    The record comes from outside the process: whoever can write to the store could make a few bytes claim millions
    of kept messages. So it is checked against the prefix it was found for before anything proportional to what it
    claims is built: its source length must be `source_length`, and its runs of kept messages, checked in one pass
    over what was read, must lie inside it, the plan holding at most `source_length` entries in all. Only then are
    the runs expanded: a plan never costs more than the request it is replayed onto. A created message must be one
    the proxy can write back (nested at most 254 levels), or every request replaying the plan would fail.

    :raises PlanDecodeError: If `data` is not a well-formed plan of a known format version over `source_length`.
    """
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise PlanDecodeError("not JSON") from error
    if not isinstance(document, list) or len(document) not in (3, 4):
        raise PlanDecodeError("not a plan")
    version, length, items, *options = document
    if version != FORMAT_VERSION:
        raise PlanDecodeError(f"unknown plan format version {version!r}")
    if not _is_index(length) or not isinstance(items, list) or not all(isinstance(each, dict) for each in options):
        raise PlanDecodeError("malformed plan header")
    if length != source_length:
        raise PlanDecodeError("a plan over another prefix than the one it is stored under")
    _check_runs(items, length)
    entries: list[Entry] = []
    for item in items:
        if isinstance(item, list):
            entries.extend(Kept(index) for index in range(item[0], item[1]))
        elif isinstance(item, dict):
            entries.append(_decode_created(item, length))
        else:
            raise PlanDecodeError("malformed plan entry")
    read_tool = any(each.get(READ_TOOL_FIELD) is True for each in options)
    return EditPlan(length, tuple(entries), read_tool)


def _check_runs(items: list[Any], source_length: int) -> None:
    """Check every run of kept messages lies inside the source, and the plan has at most `source_length` entries.

    A compaction never makes a conversation longer: each strategy replaces messages one for one or several by one,
    so a plan the proxy made, composed turn after turn, holds at most as many entries as its source.
    """
    entries = 0
    for item in items:
        if isinstance(item, list):
            if len(item) != 2 or not all(_is_index(bound) for bound in item) or not item[0] < item[1] <= source_length:
                raise PlanDecodeError("malformed run of kept messages")
            entries += item[1] - item[0]
        else:
            entries += 1
    if entries > source_length:
        raise PlanDecodeError("more entries than the prefix holds messages")


def _decode_created(item: dict[str, Any], source_length: int) -> Created:
    message, meta, replaces = item.get("m"), item.get("t"), item.get("r")
    if not isinstance(message, dict) or not isinstance(meta, dict):
        raise PlanDecodeError("malformed created message")
    if replaces is not None and not (_is_index(replaces) and replaces < source_length):
        raise PlanDecodeError("malformed replaced index")
    try:  # read, it must write back too: else every request replaying it fails (orjson writes 254 levels, reads 1,024)
        orjson.dumps(item)
    except orjson.JSONEncodeError as error:
        raise PlanDecodeError("a created message nested deeper than the proxy writes JSON") from error
    return Created(message=message, meta=meta, replaces=replaces)


def _is_index(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def supersedes(new: EditPlan, stored: EditPlan) -> bool:
    """Whether `new` may replace `stored` under the same key: it is a later compaction of the same conversation.

    Under one key both plans cover the same original prefix. A later compaction is `stored.then(compaction)`: it
    keeps some of `stored`'s entries in their order and adds only created messages, and, since a compaction always
    makes the conversation smaller, it either keeps fewer of the originals or, when it only reworked messages that
    compaction had created, holds fewer created bytes. Anything else must not replace what is stored: an older plan
    merely carried forward by another replica (replacing would lose the compaction), or a sibling compaction of the
    same base that is not a further compaction of the stored one (replacing would fork the conversation: later turns
    would replay a prefix other than the one the upstream already saw). Of two siblings, the one that is a further
    compaction of the other wins in whatever order they land; of two incomparable ones, the first written stays.
    A plan over a longer source (never under one key in practice) supersedes one over a shorter source. The same
    plan saying its conversation was sent with the read tool supersedes one that does not.
    """
    if new.source_length != stored.source_length:
        return new.source_length > stored.source_length
    places: defaultdict[bytes, list[int]] = defaultdict(list)
    for at, entry in enumerate(stored.entries):
        places[encode_entry(entry)].append(at)
    position = 0
    for entry in new.entries:
        # The first place at or after `position` holding the same entry: a search, not a scan, so that comparing
        # stays O(n log n) however many of `new`'s entries `stored` lacks (a scan each made it quadratic).
        same = places.get(encode_entry(entry), ())
        found = bisect_left(same, position)
        if found < len(same):
            position = same[found] + 1
        elif isinstance(entry, Kept):
            # An original that `stored` no longer has (or not at this place): `new` does not build on `stored`.
            return False
    new_kept, stored_kept = _kept_count(new), _kept_count(stored)
    if new_kept != stored_kept:
        return new_kept < stored_kept
    new_bytes, stored_bytes = _created_bytes(new), _created_bytes(stored)
    if new_bytes != stored_bytes:
        return new_bytes < stored_bytes
    return new.read_tool and not stored.read_tool


def _kept_count(plan: EditPlan) -> int:
    return sum(1 for entry in plan.entries if isinstance(entry, Kept))


def _created_bytes(plan: EditPlan) -> int:
    return sum(len(encode_entry(entry)) for entry in plan.entries if isinstance(entry, Created))
