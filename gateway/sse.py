"""Server-Sent Events framing (the only place it exists)."""

from __future__ import annotations

import json

CONTENT_TYPE = "text/event-stream; charset=utf-8"
# OpenAI's last event of a stream.
DONE_EVENT = b"data: [DONE]\n\n"


def sse_event(data: object, name: str | None = None) -> bytes:
    """One `data:` event holding `data` as compact JSON (no raw newlines, so one line);
    `name`: its `event:` line."""
    line = b"data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
    return (b"" if name is None else f"event: {name}\n".encode()) + line + b"\n\n"
