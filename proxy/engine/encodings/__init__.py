"""The tiktoken encodings shipped inside the package, loaded without any network access.

tiktoken normally downloads its BPE rank files on first use. A proxy in an air-gapped cluster cannot, so the two
encodings OpenAI's current models use ship as package data and are loaded from there, sha256-checked against the
digests tiktoken itself pins for them.
"""

from __future__ import annotations

import base64
import hashlib
import threading
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tiktoken

_ENDOFTEXT = "<|endoftext|>"
_FIM_PREFIX = "<|fim_prefix|>"
_FIM_MIDDLE = "<|fim_middle|>"
_FIM_SUFFIX = "<|fim_suffix|>"
_ENDOFPROMPT = "<|endofprompt|>"


@dataclass(frozen=True)
class _EncodingSpec:
    """What tiktoken needs to build an encoding besides its rank file."""

    sha256: str
    pat_str: str
    special_tokens: dict[str, int]


_SPECS: dict[str, _EncodingSpec] = {
    "o200k_base": _EncodingSpec(
        sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        pat_str="|".join(
            [
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""\p{N}{1,3}""",
                r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
                r"""\s*[\r\n]+""",
                r"""\s+(?!\S)""",
                r"""\s+""",
            ]
        ),
        special_tokens={_ENDOFTEXT: 199999, _ENDOFPROMPT: 200018},
    ),
    "cl100k_base": _EncodingSpec(
        sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        pat_str=r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",  # noqa: E501
        special_tokens={
            _ENDOFTEXT: 100257,
            _FIM_PREFIX: 100258,
            _FIM_MIDDLE: 100259,
            _FIM_SUFFIX: 100260,
            _ENDOFPROMPT: 100276,
        },
    ),
}

SHIPPED_ENCODINGS: tuple[str, ...] = tuple(_SPECS)

_load_lock = threading.Lock()


def _read_ranks(name: str, expected_sha256: str) -> dict[bytes, int]:
    """Read and verify a shipped BPE rank file: one `base64(token) rank` pair a line."""
    data = resources.files(__name__).joinpath(f"{name}.tiktoken").read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected_sha256:
        raise RuntimeError(
            f"The shipped tiktoken encoding {name!r} is corrupt (sha256 {digest}, expected {expected_sha256}). "
            "Reinstall compaction-proxy."
        )
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@cache
def _load(name: str) -> tiktoken.Encoding:
    import tiktoken

    spec = _SPECS[name]
    return tiktoken.Encoding(
        name=name,
        pat_str=spec.pat_str,
        mergeable_ranks=_read_ranks(name, spec.sha256),
        special_tokens=spec.special_tokens,
    )


def get_encoding(name: str) -> tiktoken.Encoding:
    """Return one of the shipped encodings, loading it on first use (about a second; cached for the process).

    :raises ValueError: If `name` is not one of `SHIPPED_ENCODINGS`.
    """
    if name not in _SPECS:
        raise ValueError(f"Unknown encoding {name!r}; the package ships {', '.join(SHIPPED_ENCODINGS)}.")
    with _load_lock:
        return _load(name)


def load_shipped() -> None:
    """Load every shipped encoding now (a second or so, best off the event loop), so no request waits for one."""
    for name in SHIPPED_ENCODINGS:
        get_encoding(name)
