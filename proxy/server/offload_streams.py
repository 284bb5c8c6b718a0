"""Edits to a relayed stream answering a request that carried the read tool: no read call shows, usage is the sum.

A stream whose first call is a client tool is relayed from there on, so a read call the model makes after it can no
longer be answered; it is taken out of what the client sees (chat: its `tool_calls` deltas; Responses: every event
of its output item, and the item in the final response), as a non-streamed answer's would be. After read rounds,
the usage the final stream reports becomes the sum over every upstream call made for the request.

Only events that can hold a call or, when summing, a usage are parsed; every other event is relayed byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from proxy.pipeline.offload.rounds import summed
from proxy.pipeline.offload.tool import READ_TOOL
from proxy.pipeline.wire import WireFormat
from proxy.server.sse import EventSplitter, StreamObserver, event_data, rewrite_event

_READ_TOOL_BYTES: Final = READ_TOOL.encode()


class StreamEdits:
    """Takes read calls out of a stream and sums its usage with `earlier` usages (see the module docstring).

    :param wire: The stream's wire format.
    :param earlier: The usages of the upstream calls made before this one for the same request.
    """

    def __init__(self, wire: WireFormat, earlier: Sequence[Mapping[str, Any]] = ()) -> None:
        self.wire = wire
        self.earlier = list(earlier)
        self.hidden: set[Any] = set()
        self.splitter = EventSplitter()

    def __call__(self, chunk: bytes) -> bytes:
        """The bytes to relay for `chunk`: whole events, edited (a partial event waits for its end)."""
        return b"".join(self._event(event) for event in self.splitter.feed(chunk))

    def flush(self) -> bytes:
        """What is held back at the end (an unterminated last event), unedited."""
        return self.splitter.flush()

    def _event(self, event: bytes) -> bytes:
        named = _READ_TOOL_BYTES in event
        follows = self.hidden and (b'"tool_calls"' in event or b'"output_index"' in event)
        if not named and not follows and not (self.earlier and b'"usage"' in event):
            return event
        try:
            chunk = orjson.loads(event_data(event) or b"")
        except orjson.JSONDecodeError:
            return event
        if not isinstance(chunk, dict):
            return event
        try:
            edited = self.wire.hide_read(chunk, self.hidden)
            if edited is None:
                return b""
            if self._sum(chunk) or edited:
                return rewrite_event(event, orjson.dumps(chunk))
        except Exception:  # an event of a shape no upstream should send: relayed as it came, as any inspection does
            return event
        return event

    def _sum(self, chunk: dict[str, Any]) -> bool:
        """Replace the usage the chunk reports with the sum over every call; whether it reports one."""
        if not self.earlier:
            return False
        owner = self.wire.usage_holder(chunk)
        if owner is None:
            return False
        owner["usage"] = summed([*self.earlier, owner["usage"]])
        return True


class EditedStream:
    """A `StreamObserver` fed with what `StreamEdits` made of the upstream's bytes: the relay's transform."""

    def __init__(self, observer: StreamObserver, edits: StreamEdits) -> None:
        self.observer = observer
        self.edits = edits

    def __call__(self, chunk: bytes) -> bytes:
        """The bytes to relay for `chunk`."""
        return self.observer.feed(self.edits(chunk))

    def finish(self) -> bytes:
        """The stream ended: what is still to relay."""
        return self.observer.feed(self.edits.flush()) + self.observer.finish()
