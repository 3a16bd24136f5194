"""`python -m bench.soak [--duration S]`: mixed traffic against a real server and gateway.

Every protocol, streamed and not; about 10% of the requests left mid-way by their client
(after a stream's first event, or right after sending), 10% malformed, and regular bursts
above the engine's queue limit. At the end it
prints and writes (JSON) what came back by kind, latency percentiles, the KV blocks and slots
still held once traffic has stopped (must be 0), the server's resident memory growth between
the first and the last part of the run (must stay under 5%), and any 5xx that was not a
refusal for load (must be 0). Exits 1 when a must-hold figure fails.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import random
import ssl
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bench.metrics import percentile
from switchboard.engine.config import QUANTIZATIONS
from switchboard.process import GatewayProcess, ServerProcess
from switchboard.tls import DevPKIPaths, write_dev_pki

MODEL = "smollm2"
# A small engine, so that bursts overflow its queue: running + waiting at most 12.
SERVER_CONFIG = {"maxBatchSize": 8, "maxQueueLen": 4}
WORKERS = 6
BURST_EVERY_S = 15.0
BURST_SIZE = 24
NEW_TOKENS = 8
REFUSED_BACKOFF_S = 0.2  # a worker refused for load waits this long, as a polite client
RSS_SAMPLE_EVERY_S = 2.0
# Resident memory is sampled after a warm-up (a quarter of the run, at most a minute: the
# allocator settles), then its first and last windows (a minute each, at most a fifth of
# the samples) are compared.
WARM_UP_SHARE, WARM_UP_MAX_S = 0.25, 60.0
RSS_WINDOW_S, RSS_WINDOW_SHARE = 60.0, 0.2
MAX_RSS_GROWTH = 0.05
DRAIN_TIMEOUT_S = 60.0
PROMPT = "Tell me about the sea."
# kind → (path, body, streamed); the mix every worker draws from.
KINDS: dict[str, tuple[str, dict[str, object], bool]] = {
    "triton_generate": (f"/v2/models/{MODEL}/generate",
                        {"text_input": PROMPT, "parameters": {"max_new_tokens": NEW_TOKENS}}, False),
    "triton_stream": (f"/v2/models/{MODEL}/generate_stream",
                      {"text_input": PROMPT, "parameters": {"max_new_tokens": NEW_TOKENS}}, True),
    "kserve_infer": (f"/v2/models/{MODEL}/infer", {"inputs": [
        {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [PROMPT]}],
        "parameters": {"max_new_tokens": NEW_TOKENS}}, False),
    "tgi_generate": ("/generate", {"inputs": PROMPT,
                                   "parameters": {"max_new_tokens": NEW_TOKENS}}, False),
    "tgi_stream": ("/generate_stream", {"inputs": PROMPT,
                                        "parameters": {"max_new_tokens": NEW_TOKENS}}, True),
    "vllm_generate": ("/generate", {"prompt": PROMPT, "max_tokens": NEW_TOKENS}, False),
    "openai_chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                             "max_tokens": NEW_TOKENS}, False),
    "openai_chat_stream": ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": PROMPT}], "max_tokens": NEW_TOKENS,
        "stream": True}, True),
    "openai_completion": ("/v1/completions", {"prompt": PROMPT, "max_tokens": NEW_TOKENS}, False),
    "mindie_infer": ("/infer", {"inputs": PROMPT,
                                "parameters": {"max_new_tokens": NEW_TOKENS}}, False),
    "mindie_stream": ("/infer", {"inputs": PROMPT, "stream": True,
                                 "parameters": {"max_new_tokens": NEW_TOKENS}}, True),
}
MALFORMED: tuple[tuple[str, bytes], ...] = (
    ("/generate", b'{"inputs": "x", "parameters": {"max_new_tokens": -3}}'),
    ("/v1/chat/completions", b'{"messages": "not a list"}'),
    ("/infer", b"{not json"),
    (f"/v2/models/{MODEL}/generate", b'{"text_input": "x", "parameters": {"top_p": 7}}'),
    ("/v1/completions", b'{"prompt": "x", "temperature": "hot"}'),
)
# Statuses that refuse for load: expected during bursts.
REFUSALS = {429, 503}


@dataclass(slots=True)
class Outcome:
    kind: str
    status: int | None  # None: no HTTP answer (connection failed)
    latency_s: float
    body: bytes = b""


class Gateway:
    """A minimal HTTP/1.1 client over mutual TLS (one connection per request), able to drop a
    stream mid-way as a departing client does."""

    def __init__(self, base_url: str, pki: DevPKIPaths) -> None:
        parts = urlsplit(base_url)
        self.host, self.port = parts.hostname, parts.port
        self.context = ssl.create_default_context(cafile=str(pki.ca_cert))
        self.context.load_cert_chain(str(pki.client_cert), str(pki.client_key))

    async def request(self, kind: str, method: str, path: str, body: bytes = b"",
                      drop: bool = False, streamed: bool = False) -> Outcome:
        """`drop`: leave mid-way, after a stream's first event, or right after sending a
        request whose reply is not streamed."""
        start = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port,
                                                           ssl=self.context)
        except OSError:
            return Outcome(kind, None, time.monotonic() - start)
        try:
            writer.write(f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nConnection: close\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                         .encode() + body)
            await writer.drain()
            if drop and not streamed:
                return Outcome(kind, None, time.monotonic() - start)
            status_line = await reader.readline()
            status = int(status_line.split()[1]) if status_line else None
            if drop and status == 200:
                await reader.readuntil(b"\n\n")
                return Outcome(kind, status, time.monotonic() - start)
            payload = await reader.read()
            return Outcome(kind, status, time.monotonic() - start,
                           payload.partition(b"\r\n\r\n")[2])
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            return Outcome(kind, None, time.monotonic() - start)
        finally:
            writer.close()

    async def json(self, path: str) -> object:
        return json.loads((await self.request("probe", "GET", path)).body)


async def drive(gateway: Gateway, duration_s: float, seed: int,
                server: ServerProcess) -> tuple[list[Outcome], list[int]]:
    rng = random.Random(seed)
    outcomes: list[Outcome] = []
    rss: list[int] = []
    deadline = time.monotonic() + duration_s

    async def one(kind: str | None = None) -> None:
        draw = rng.random()
        if kind is None and draw < 0.1:
            path, body = rng.choice(MALFORMED)
            outcomes.append(await gateway.request("malformed", "POST", path, body))
            return
        dropped = kind is None and draw > 0.9
        kind = kind or rng.choice(list(KINDS))
        path, document, streamed = KINDS[kind]
        outcomes.append(await gateway.request("dropped" if dropped else kind, "POST", path,
                                              json.dumps(document).encode(), dropped, streamed))

    async def worker() -> None:
        while time.monotonic() < deadline:
            await one()
            if outcomes[-1].status in REFUSALS:
                await asyncio.sleep(REFUSED_BACKOFF_S)

    async def bursts() -> None:
        while time.monotonic() + BURST_EVERY_S < deadline:
            await asyncio.sleep(BURST_EVERY_S)  # the load's own rhythm, not a wait for a signal
            await asyncio.gather(*(one("tgi_generate") for _ in range(BURST_SIZE)))

    async def sample_rss() -> None:
        await asyncio.sleep(min(duration_s * WARM_UP_SHARE, WARM_UP_MAX_S))
        while time.monotonic() < deadline:
            rss.append(server.rss_bytes())
            await asyncio.sleep(RSS_SAMPLE_EVERY_S)

    await asyncio.gather(*(worker() for _ in range(WORKERS)), bursts(), sample_rss())
    return outcomes, rss


async def leaks(management: Gateway) -> tuple[int, int]:
    """KV blocks and slots still held once traffic has stopped (the drops' requests may take
    a step to be freed: polled until clean or DRAIN_TIMEOUT_S)."""
    give_up = time.monotonic() + DRAIN_TIMEOUT_S
    while True:
        status = await management.json("/v1/status")
        resource = status["resource"]
        blocks = resource["totalNpuBlockNums"] - resource["availBlockNum"]
        slots = await management.json(f"/v2/models/{MODEL}/getSlotCount")
        held_slots = slots["total_slots"] - slots["free_slots"]
        if (blocks == 0 and held_slots == 0) or time.monotonic() > give_up:
            return blocks, held_slots
        await asyncio.sleep(0.2)


def summarize(outcomes: Sequence[Outcome], rss: Sequence[int], leaked_blocks: int,
              leaked_slots: int, duration_s: float) -> dict[str, object]:
    by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    unexpected: list[str] = []
    for outcome in outcomes:
        counts = by_kind[outcome.kind]
        counts["sent"] += 1
        if outcome.kind == "malformed":
            ok = outcome.status is not None and 400 <= outcome.status < 500
            counts["refused as malformed" if ok else "failed"] += 1
        elif outcome.kind == "dropped":
            counts["left mid-way"] += 1
        elif outcome.status == 200:
            counts["succeeded"] += 1
        elif outcome.status in REFUSALS:
            counts["refused for load"] += 1
        else:
            counts["failed"] += 1
        if outcome.status is not None and outcome.status >= 500 \
                and outcome.status not in REFUSALS:
            unexpected.append(f"{outcome.kind}: {outcome.status} {outcome.body[:200]!r}")
    latencies = [o.latency_s for o in outcomes if o.status == 200 and o.kind != "dropped"]
    window = max(1, min(int(RSS_WINDOW_S / RSS_SAMPLE_EVERY_S), int(len(rss) * RSS_WINDOW_SHARE)))
    first, last = rss[:window], rss[-window:]
    growth = (sum(last) / len(last)) / (sum(first) / len(first)) - 1 if rss else 0.0
    failed = sum(counts["failed"] for counts in by_kind.values())
    return {
        "duration_s": duration_s,
        "requests": {kind: dict(counts) for kind, counts in sorted(by_kind.items())},
        "latency_p50_s": percentile(latencies, 50),
        "latency_p99_s": percentile(latencies, 99),
        "leaked_kv_blocks": leaked_blocks,
        "leaked_slots": leaked_slots,
        "server_rss_first_bytes": first and sum(first) // len(first),
        "server_rss_last_bytes": last and sum(last) // len(last),
        "server_rss_growth": growth,
        "unexpected_5xx": len(unexpected),
        "unexpected_5xx_examples": unexpected[:5],
        "failed": failed,
        "passed": leaked_blocks == 0 and leaked_slots == 0 and not unexpected and failed == 0
        and growth < MAX_RSS_GROWTH,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quantization", choices=QUANTIZATIONS, default="auto",
                        help="the server's --quantization (default: auto, as the server's)")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "soak.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="switchboard-soak-") as folder:
        pki = write_dev_pki(Path(folder) / "pki")
        config = Path(folder) / "config.json"
        config.write_text(json.dumps(SERVER_CONFIG))
        server = ServerProcess("--tls-dir", str(pki.folder), "--config", str(config),
                               "--quantization", args.quantization)
        try:
            server.wait_ready()
            gateway = GatewayProcess("--tls-dir", str(pki.folder), "--upstream", server.address,
                                     "--http-port", "0", "--management-port", "0",
                                     "--metrics-port", "0")
            try:
                gateway.wait_ready()
                business = Gateway(gateway.url("business"), pki)
                management = Gateway(gateway.url("management"), pki)
                print(f"soak: {args.duration:g} s of mixed traffic", flush=True)
                outcomes, rss = asyncio.run(drive(business, args.duration, args.seed, server))
                leaked_blocks, leaked_slots = asyncio.run(leaks(management))
            finally:
                gateway.stop()
        finally:
            server.stop()
    figures = summarize(outcomes, rss, leaked_blocks, leaked_slots, args.duration)
    print(json.dumps(figures, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"{'PASS' if figures['passed'] else 'FAIL'}; wrote {args.out}")
    return 0 if figures["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
