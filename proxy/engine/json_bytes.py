"""JSON bytes sized to their length, for what is kept beyond the moment it is made.

orjson returns what it wrote in the buffer it wrote it into, grown in steps and never shrunk (3.12 and later: at
least 4 KiB): a 50-byte result kept in a cache holds 4 KiB, a 3.3 MB body 4.2 MB. Bytes the proxy keeps (cached
canonical forms, the bodies it forwards and remembers) are copied into a buffer of their own length: a quarter more
time than serializing alone (0.74 against 0.59 ms for a 3.3 MB body).
"""

from __future__ import annotations

from typing import Any

import orjson


def sized(data: bytes) -> bytes:
    """`data` in a buffer of its own length (a copy)."""
    return bytes(memoryview(data))


def json_bytes(value: Any) -> bytes:
    """`value` as compact JSON (orjson's), in a buffer of its own length."""
    return sized(orjson.dumps(value))
