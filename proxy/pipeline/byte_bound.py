"""A small request sized by its bytes: when even that bound is under the trigger, nothing else is worked out.

Every token a BPE tokenizer makes covers at least one byte, and a request's JSON spends more bytes on each
message's framing (`{"role":"user","content":""}`) than a chat template spends tokens, so a body's length bounds
its token count from above, calibrated as the engine's own bounds are. A request whose bound is under the trigger
cannot need compacting, and most requests of an agent's early turns are such: the proxy forwards the body as it
came, without hashing its messages, looking up anchors and rewrites, or remembering it for the next turn. That
leaves the first turns after the bound of a conversation without a usage anchor: they are counted locally, long
before the trigger is near.

Where the upstream counts prompts exactly (`count_probes`), its count is asked for instead: a local model's window
is small, and the count tells how close to it the conversation is.

Media do not fit the bound (a 40-byte image URL can cost a thousand tokens), so a request with an image, audio or
file part is measured the full way, and so is one with any part the format maps to something else than text (a
Messages API `thinking` block, a document, a server tool's result). What the provider adds to the prompt without a
byte of the body showing it (the Messages API's tool-use system prompt) is added to the bound.

A conversation that was compacted under a lower trigger (a larger `max_tokens`, a smaller `X-Context-Window`) and
whose next request fits even without its rewrite is forwarded whole, as it came.
"""

from __future__ import annotations

import math
from typing import Final

SIZED_BELOW_BYTES: Final = 32 * 1024
"""Bodies under this size are sized by their bytes first: larger ones are recognized from their bytes instead where
the format can (`ByteSplicing.from_bytes`, this same size for chat completions), which costs less than the parse
this needs."""


def bytes_bound(raw: bytes, scale: float, added: int = 0) -> int:
    """An upper bound on the tokens the provider counts for the request `raw`, known to hold text only.

    :param scale: Provider tokens per local token (the calibration the engine's bounds are multiplied by).
    :param added: Tokens the provider adds that no byte of `raw` shows (`WireRequest.added_prompt_tokens`).
    """
    return math.ceil(scale * (len(raw) + added))
