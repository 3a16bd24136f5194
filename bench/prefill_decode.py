"""`python -m bench --prefill-decode`: two servers on this machine, one prefilling and one
decoding (vLLM's kv_transfer_params, driven over gRPC as vLLM's proxy drives them), against
the decoding server alone on the same prompts: time to first token and tokens/s; and the
time a 1,000-token prompt's KV cache takes to move between them (KVTransfer.ReadKV over
mutual TLS on loopback). Both servers share the machine's cores, which a real pair would not:
the comparison shows what the handoff costs, not what a second machine gains."""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

from bench.grpc_load import secure_channel
from bench.host_path import processor
from switchboard.process import ServerProcess
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto import switchboard_pb2_grpc as sb_grpc
from switchboard.tls import DevPKIPaths, write_dev_pki

TRANSFER_PROMPT_TOKENS = 1000
TRANSFER_TURNS = 5
STREAMS = (1, 4)
REQUESTS = 8
PROMPT_TOKENS = (200, 400)
NEW_TOKENS = 32
# Prompts are ordinary tokens of the model's vocabulary, these ids on.
FIRST_TOKEN_ID = 100
VOCABULARY_SPAN = 40_000

Timed = tuple[float, int]  # (seconds to the first token, tokens generated)


async def _generate(stub: sb_grpc.GenerationStub, prompt: Sequence[int], new_tokens: int,
                    transfer: sb.KVTransferParams | None = None
                    ) -> tuple[float, int, sb.KVTransferParams | None]:
    """(seconds to the first token, tokens, the answer's kv_transfer_params)"""
    request = sb.GenerateRequest(token_ids=sb.TokenIds(ids=prompt))
    request.sampling.max_new_tokens = new_tokens
    request.sampling.ignore_eos = True
    if transfer is not None:
        request.kv_transfer_params.CopyFrom(transfer)
    start = time.perf_counter()
    first, tokens, params = 0.0, 0, None
    async for response in stub.Generate(request):
        if response.tokens and not tokens:
            first = time.perf_counter() - start
        tokens += len(response.tokens)
        if response.HasField("kv_transfer_params"):
            params = response.kv_transfer_params
    return first, tokens, params


async def _alone(decode: sb_grpc.GenerationStub, prompt: Sequence[int]) -> Timed:
    first, tokens, _ = await _generate(decode, prompt, NEW_TOKENS)
    return first, tokens


async def _split(prefill: sb_grpc.GenerationStub, decode: sb_grpc.GenerationStub,
                 prompt: Sequence[int]) -> Timed:
    """The first token's time counts the prefill server's turn."""
    start = time.perf_counter()
    *_, params = await _generate(prefill, prompt, 1, sb.KVTransferParams(do_remote_decode=True))
    handed_over = time.perf_counter() - start
    first, tokens, _ = await _generate(decode, prompt, NEW_TOKENS, params)
    return handed_over + first, tokens


async def _level(streams: int, prompts: Sequence[tuple[int, ...]],
                 one: Callable[[tuple[int, ...]], Awaitable[Timed]]) -> dict[str, float]:
    """Closed loop: `streams` workers send the prompts; TTFT p50 and tokens/s."""
    waiting = list(prompts)
    firsts: list[float] = []
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        while waiting:
            first, count = await one(waiting.pop())
            firsts.append(first)
            tokens += count

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(streams)))
    return {"ttft_p50_s": statistics.median(firsts),
            "tokens_per_s": tokens / (time.perf_counter() - start)}


async def _transfer_seconds(prefill: sb_grpc.GenerationStub,
                            kv: sb_grpc.KVTransferStub) -> tuple[float, int]:
    """The best of TRANSFER_TURNS reads of a 1,000-token prompt's KV cache, and its bytes."""
    times, size = [], 0
    for turn in range(TRANSFER_TURNS):
        prompt = [FIRST_TOKEN_ID + (turn * 7919 + i * 13) % VOCABULARY_SPAN
                  for i in range(TRANSFER_PROMPT_TOKENS)]
        *_, params = await _generate(prefill, prompt, 1,
                                     sb.KVTransferParams(do_remote_decode=True))
        start = time.perf_counter()
        size = sum([len(chunk.data) async for chunk in kv.ReadKV(
            sb.ReadKVRequest(transfer_id=params.remote_request_id))])
        times.append(time.perf_counter() - start)
        await kv.ReleaseKV(sb.ReleaseKVRequest(transfer_id=params.remote_request_id))
    return min(times), size


def _prompts(run: int) -> list[tuple[int, ...]]:
    """Prompts of their own for each run: no run finds another's in a prefix cache."""
    return [tuple(FIRST_TOKEN_ID + ((run * REQUESTS + i) * 997 + j * 13) % VOCABULARY_SPAN
                  for j in range(PROMPT_TOKENS[i % 2])) for i in range(REQUESTS)]


async def _measure(prefill_address: str, decode_address: str, pki: DevPKIPaths
                   ) -> dict[str, object]:
    files = (pki.ca_cert, pki.client_cert, pki.client_key)
    async with secure_channel(prefill_address, *files) as to_prefill, \
            secure_channel(decode_address, *files) as to_decode:
        prefill = sb_grpc.GenerationStub(to_prefill)
        decode = sb_grpc.GenerationStub(to_decode)
        transfer_s, transfer_bytes = await _transfer_seconds(prefill,
                                                             sb_grpc.KVTransferStub(to_prefill))
        runs = iter(range(1, 2 * len(STREAMS) + 1))
        await _alone(decode, _prompts(0)[0])  # warm-up
        levels = {}
        for streams in STREAMS:
            levels[streams] = {
                "one server": await _level(streams, _prompts(next(runs)),
                                           lambda p: _alone(decode, p)),
                "prefill + decode": await _level(streams, _prompts(next(runs)),
                                                 lambda p: _split(prefill, decode, p))}
    return {"transfer_seconds": transfer_s, "transfer_bytes": transfer_bytes,
            "levels": levels}


def _markdown(result: dict[str, object]) -> str:
    lines = [f"# Prefill/decode on one machine ({result['processor']}, {result['date']})", "",
             f"Server flags: `{' '.join(result['server_flags']) or '(defaults)'}`. "
             f"{REQUESTS} prompts of {PROMPT_TOKENS[0]} and {PROMPT_TOKENS[1]} tokens, "
             f"{NEW_TOKENS} new tokens each, over gRPC. Both servers share the cores.", "",
             f"KV cache of a {TRANSFER_PROMPT_TOKENS}-token prompt: "
             f"{result['transfer_bytes'] / 2**20:.1f} MiB read in "
             f"{result['transfer_seconds'] * 1000:.0f} ms (best of {TRANSFER_TURNS}; "
             "mutual TLS on loopback).", "",
             "| streams | route | TTFT p50 | tokens/s |", "|---|---|---|---|"]
    for streams, routes in result["levels"].items():
        for route, figures in routes.items():
            lines.append(f"| {streams} | {route} | {figures['ttft_p50_s']:.3f} s | "
                         f"{figures['tokens_per_s']:.1f} |")
    return "\n".join(lines) + "\n"


def run(out: Path, server_flags: Sequence[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="switchboard-bench-") as folder:
        pki = write_dev_pki(Path(folder))
        servers = [ServerProcess("--tls-dir", str(pki.folder), *server_flags)
                   for _ in range(2)]
        try:
            prefill, decode = (server.address for server in servers)
            result = asyncio.run(_measure(prefill, decode, pki))
        finally:
            for server in servers:
                server.stop()
    result.update(processor=processor(), server_flags=list(server_flags),
                  date=datetime.now(timezone.utc).date().isoformat())
    out.mkdir(parents=True, exist_ok=True)
    (out / "prefill-decode.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "prefill-decode.md").write_text(_markdown(result))
    print(_markdown(result))
    return 0
