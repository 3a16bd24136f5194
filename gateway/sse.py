"""Server-Sent Events framing (the only place it exists)."""

from __future__ import annotations

import json

CONTENT_TYPE = "text/event-stream; charset=utf-8"


def sse_event(data: object) -> bytes:
    """One `data:` event holding `data` as compact JSON (no raw newlines, so one line)."""
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
