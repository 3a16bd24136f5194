"""KServe v2's BYTES tensor wire format, shared by the server and the gateway: each element
is a 4-byte little-endian length followed by its bytes (raw_input_contents,
raw_output_contents, and the REST binary data extension)."""

from __future__ import annotations

import struct
from collections.abc import Iterable


def serialize_bytes(elements: Iterable[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(element)) + element for element in elements)


def deserialize_bytes(data: bytes) -> list[bytes]:
    """Raises ValueError, saying where, when the data is not a sequence of elements."""
    elements: list[bytes] = []
    offset = 0
    while offset < len(data):
        if offset + 4 > len(data):
            raise ValueError("BYTES data ends inside a 4-byte length prefix")
        (length,) = struct.unpack_from("<I", data, offset)
        offset += 4
        if offset + length > len(data):
            raise ValueError(f"BYTES element of {length} bytes runs past the data")
        elements.append(data[offset:offset + length])
        offset += length
    return elements
