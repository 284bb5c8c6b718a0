"""Calibration: how many of the provider's tokens one locally counted token is worth.

A local tokenizer is exact only for the models it belongs to. Against Llama, Qwen or Mistral models tiktoken can be
off by 40% and more, so a trigger built on it fires too late or too early. Every provider report is a free
measurement: when a request is anchored, the provider's count for the anchored prefix is compared with the local
count of the same prefix, and the running ratio scales local counts of whatever is new. The proxy keeps one
calibration per model; the Haystack hook one per hook.
"""

from __future__ import annotations

import threading

MIN_SAMPLE_TOKENS = 64
"""Smaller prefixes are too dominated by fixed overheads to say anything about the tokenizer."""

RATIO_BOUNDS = (0.25, 4.0)
"""A ratio outside these bounds is a mismatch of what was counted, not of tokenizers; it is ignored."""


class Calibration:
    """A running estimate of provider tokens per local token, starting at 1.

    :param smoothing: Weight of each new observation in the running ratio (the first one is taken as it is).
    :raises ValueError: If `smoothing` is not in (0, 1].
    """

    def __init__(self, smoothing: float = 0.5) -> None:
        if not 0 < smoothing <= 1:
            raise ValueError(f"`smoothing` must be in (0, 1], got {smoothing}.")
        self.smoothing = smoothing
        self.ratio = 1.0
        self.samples = 0
        self._lock = threading.Lock()

    def observe(self, local_tokens: int, provider_tokens: int) -> None:
        """Learn from the provider's count of something counted locally as `local_tokens`."""
        if local_tokens < MIN_SAMPLE_TOKENS or provider_tokens <= 0:
            return
        observed = provider_tokens / local_tokens
        if not RATIO_BOUNDS[0] <= observed <= RATIO_BOUNDS[1]:
            return
        with self._lock:
            self.ratio = observed if self.samples == 0 else self.ratio + self.smoothing * (observed - self.ratio)
            self.samples += 1
