"""Server-Sent Events framing (the only place it exists)."""

from __future__ import annotations

import json

CONTENT_TYPE = "text/event-stream; charset=utf-8"
# OpenAI's last event of a stream.
DONE_EVENT = b"data: [DONE]\n\n"


def sse_event(data: object) -> bytes:
    """One `data:` event holding `data` as compact JSON (no raw newlines, so one line)."""
    return b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
