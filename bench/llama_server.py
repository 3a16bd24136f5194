"""llama.cpp's `llama-server` on the same GGUF file, as issue 41 ran it: 2 threads, 64 slots
with continuous batching over a KV cache of 16384 tokens split between them
(`--no-kv-unified`), plain HTTP on loopback. Its binary is the user's (docs/performance-defaults.md
says how to build one)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from pathlib import Path

import psutil
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

START_TIMEOUT_S = 300
HEALTH_POLL_S = 0.5
SLOTS = 64
CONTEXT_TOKENS = 16384


class LlamaServer:
    def __init__(self, binary: Path, gguf: Path, threads: int) -> None:
        self.port = _free_port()
        self.process = subprocess.Popen(
            [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
             "-t", str(threads), "-np", str(SLOTS), "-c", str(CONTEXT_TOKENS),
             "--no-kv-unified"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def wait_ready(self) -> None:
        """Until /health answers 200 (503 while the model loads); the server has no readiness
        signal of its own to wait on."""
        client = AsyncHTTPClient(force_instance=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while True:
                if self.process.poll() is not None:
                    raise RuntimeError(f"llama-server exited with {self.process.returncode}")
                try:
                    await client.fetch(f"{self.base_url}/health")
                    return
                except (HTTPClientError, OSError):
                    if time.monotonic() > deadline:
                        raise RuntimeError("llama-server did not become ready") from None
                await asyncio.sleep(HEALTH_POLL_S)
        finally:
            client.close()

    def cpu_seconds(self) -> float:
        times = psutil.Process(self.process.pid).cpu_times()
        return times.user + times.system

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _free_port() -> int:
    """A port free now (llama-server takes no port 0 to report back)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
