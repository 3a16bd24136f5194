"""Closed-loop load on OpenAI's streamed `/v1/completions` (see `levels.py`), the route users
call: through the gateway with mutual TLS, or llama.cpp's llama-server (plain HTTP), with the
same prompts (as token ids, so both compute the same tokens) and this same client. Greedy,
EOS ignored; a server-sent event with text is a token, and the final usage says how many
tokens came."""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from bench.levels import LevelResult, Prompt, Timing, run_level

REQUEST_TIMEOUT_S = 3600


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where the route is: a base URL, the model name it serves, and the client's TLS (None:
    plain HTTP)."""

    base_url: str
    model: str
    tls: ssl.SSLContext | None = None


def mutual_tls(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    return context


async def run_openai_level(endpoint: Endpoint, name: str, streams: int,
                           prompts: Sequence[Prompt], max_new_tokens: int,
                           cpu_seconds: Callable[[], float]) -> LevelResult:
    """`prompts` through `streams` closed-loop workers, each request on a connection of its
    own (as many as streams)."""
    client = AsyncHTTPClient(force_instance=True, max_clients=streams)
    try:
        return await run_level(name, streams, prompts,
                               partial(_one_request, client, endpoint,
                                       max_new_tokens=max_new_tokens), cpu_seconds)
    finally:
        client.close()


class _EventStream:
    """Parses the streamed body into server-sent events as it arrives, timing the tokens."""

    def __init__(self, timing: Timing) -> None:
        self.timing = timing
        self.usage_tokens: int | None = None
        self._buffer = b""
        self._start = self._last = time.perf_counter()

    def feed(self, chunk: bytes) -> None:
        now = time.perf_counter()
        self._buffer += chunk
        *events, self._buffer = self._buffer.split(b"\n\n")
        for event in events:
            for line in event.splitlines():
                if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
                    self._on_data(json.loads(line[5:]), now)

    def _on_data(self, data: dict, now: float) -> None:
        if "error" in data:
            self.timing.error = json.dumps(data["error"])
            return
        if any(choice.get("text") for choice in data.get("choices") or ()):
            self.timing.add_tokens(1, now - self._start, now - self._last)
            self._last = now
        if data.get("usage"):
            self.usage_tokens = data["usage"]["completion_tokens"]


async def _one_request(client: AsyncHTTPClient, endpoint: Endpoint, prompt: Prompt,
                       joins_running: bool, *, max_new_tokens: int) -> Timing:
    timing = Timing(joins_running)
    stream = _EventStream(timing)
    body = {"model": endpoint.model, "prompt": list(prompt), "max_tokens": max_new_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    request = HTTPRequest(f"{endpoint.base_url}/v1/completions", method="POST",
                          headers={"Content-Type": "application/json"},
                          body=json.dumps(body), ssl_options=endpoint.tls,
                          streaming_callback=stream.feed, request_timeout=REQUEST_TIMEOUT_S)
    try:
        await client.fetch(request)
    except (HTTPClientError, OSError) as error:
        timing.error = f"{type(error).__name__}: {error}"
    if stream.usage_tokens is not None:  # a token of no text of its own has no event
        timing.tokens = stream.usage_tokens
    if timing.error is None and stream.usage_tokens != max_new_tokens:
        timing.error = (f"expected {max_new_tokens} tokens; the usage reported "
                        f"{stream.usage_tokens} ({timing.tokens} events with text)")
    return timing
