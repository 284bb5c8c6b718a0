"""A rewrite's texts put back into the parts the client sent them in.

The engine rewrites a message's text (cuts it, offloads it behind a reference) and hands back its texts; a format
maps them back onto the client's own parts (Messages API text blocks, Responses API text parts), so what else a
part carries (a cache breakpoint, annotations) goes out as the client sent it. The texts replace the text parts in
order. A rewrite with fewer texts than the parts replaced all of them (a user message of a reminder and the user's
words offloaded to one reference): the text parts past its texts go, else the provider reads them on top of what the
engine counted, the compaction lands above its target and the next one comes sooner. A rewrite with no text leaves
the parts as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


def rewritten_texts(parts: Sequence[Any], texts: Sequence[str], is_text: Callable[[Any], bool]) -> list[Any]:
    """`parts` with each text part's `text` taken, in order, from `texts`; None for each text part past them.

    :param is_text: Whether a part is a text part (a mapping with a string `text`) whose text a rewrite replaces.
    """
    if not texts:
        return list(parts)
    remaining = iter(texts)
    rewritten: list[Any] = []
    for part in parts:
        if is_text(part) and isinstance(part, Mapping):
            text = next(remaining, None)
            rewritten.append(None if text is None else {**part, "text": text})
        else:
            rewritten.append(part)
    return rewritten
