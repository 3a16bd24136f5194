"""`python -m bench --host-path`: the serving path's own cost per generated token, on any
machine. A tiny random Llama (2 layers, hidden 32) with a tiny byte-level BPE vocabulary
trained on the spot costs next to nothing to compute, so its tokens/s measure scheduling,
sampling bookkeeping, detokenisation and hand-offs: in process (`AsyncEngine.generate`),
then through the real server's gRPC, unary `ModelInfer` and streamed `ModelStreamInfer`
(one response per token). Host µs per request-token: the wall time over the tokens, which
is the time each generated token costs the host when nothing else does."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import platform
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from datetime import datetime, timezone
from pathlib import Path

import grpc
import torch
from tokenizers import ByteLevelBPETokenizer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from bench.grpc_load import infer_request, run_level, secure_channel
from bench.metrics import cpu_seconds
from bench.workload import PARAGRAPH, PromptSource
from switchboard.engine.async_engine import AsyncEngine
from switchboard.engine.config import EngineConfig
from switchboard.engine.errors import EngineError
from switchboard.engine.params import GenerationRequest, SamplingParams
from switchboard.process import ServerProcess
from switchboard.proto import grpc_service_pb2_grpc as pb_grpc
from switchboard.tls import write_dev_pki

LEVELS = (1, 16, 64, 200, 256)
MAX_BATCH_SIZE = max(LEVELS)
PROMPT_TOKENS = 32
NEW_TOKENS = 64
VOCABULARY = 400  # byte-level BPE: the 256 bytes, merges, and EOS
EOS = "<|endoftext|>"
MIN_REQUESTS = 16
# One intra-op thread: the tiny model's ops are too small to share, and a team of two stalls
# at every op while another process holds the other core.
ENGINE_THREADS = 1
MODES = ("in process", "gRPC unary", "gRPC streamed")

Prompts = list[tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class HostPathRow:
    """One mode at one level: generated tokens over the wall time, and the CPU time of the
    process that generated (the bench's own for in process, the server's through gRPC)."""

    mode: str
    streams: int
    requests: int
    errors: int
    tokens: int
    wall_s: float
    cpu_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def host_us_per_token(self) -> float:
        return 1e6 * self.wall_s / self.tokens if self.tokens else float("nan")

    @property
    def cpu_us_per_token(self) -> float:
        return 1e6 * self.cpu_s / self.tokens if self.tokens else float("nan")


def write_tiny_model(folder: Path) -> Path:
    """A random 2-layer Llama of hidden size 32 with a VOCABULARY-token byte-level BPE
    trained on the bench's paragraph; returns its Hugging Face folder."""
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator([PARAGRAPH], vocab_size=VOCABULARY, special_tokens=[EOS],
                                show_progress=False)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=trainer._tokenizer, eos_token=EOS,
                                        bos_token=EOS)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id,
                         architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run(levels: Sequence[int], out: Path) -> int:
    load_at_start = os.getloadavg()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="switchboard-host-path-") as folder:
        model = write_tiny_model(Path(folder) / "model")
        tokenizer = PreTrainedTokenizerFast.from_pretrained(model)
        source = PromptSource(tokenizer.encode(PARAGRAPH), seed=1234, min_len=PROMPT_TOKENS,
                              max_len=PROMPT_TOKENS)
        prompts = {streams: source.draw(max(2 * streams, MIN_REQUESTS)) for streams in levels}
        warm_up = source.draw(MIN_REQUESTS)
        rows = asyncio.run(_in_process(model, levels, prompts, warm_up))
        rows += _through_grpc(model, Path(folder), levels, prompts, warm_up)
    duration_s = time.perf_counter() - started
    print()
    print(text_table(rows))
    print(f"run took {duration_s:.0f} s")
    _write(out, rows, levels, duration_s, load_at_start)
    return 0


async def _in_process(model: Path, levels: Sequence[int], prompts: dict[int, Prompts],
                      warm_up: Prompts) -> list[HostPathRow]:
    engine = await AsyncEngine.load(EngineConfig(model=model, device="cpu", dtype="float32",
                                                 max_batch_size=MAX_BATCH_SIZE,
                                                 num_threads=ENGINE_THREADS))
    engine.start(asyncio.get_running_loop())
    await engine.wait_ready()
    counter = itertools.count()

    async def one(prompt: tuple[int, ...]) -> int:
        request = GenerationRequest(
            request_id=str(next(counter)), prompt_token_ids=prompt,
            sampling=SamplingParams(do_sample=False, seed=0, max_new_tokens=NEW_TOKENS,
                                    ignore_eos=True))
        tokens = 0
        async for output in engine.generate(request):
            tokens += len(output.new_token_ids)
        return tokens

    try:
        return await _levels(MODES[0], levels, prompts, warm_up, one, time.process_time)
    finally:
        await engine.shutdown()


def _through_grpc(model: Path, folder: Path, levels: Sequence[int], prompts: dict[int, Prompts],
                  warm_up: Prompts) -> list[HostPathRow]:
    pki = write_dev_pki(folder / "pki")
    config = folder / "config.json"
    config.write_text(json.dumps({"maxBatchSize": MAX_BATCH_SIZE,
                                  "engineThreads": ENGINE_THREADS}))
    server = ServerProcess("--tls-dir", str(pki.folder), "--model", str(model),
                           "--device", "cpu", "--dtype", "float32", "--config", str(config))
    try:
        server.wait_ready()

        async def drive() -> list[HostPathRow]:
            async with secure_channel(server.address, pki.ca_cert, pki.client_cert,
                                      pki.client_key) as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)

                async def unary(prompt: tuple[int, ...]) -> int:
                    response = await stub.ModelInfer(
                        infer_request(server.model_name, prompt, NEW_TOKENS))
                    return len(response.raw_output_contents[0]) // 4

                rows = await _levels(MODES[1], levels, prompts, warm_up, unary,
                                     partial(cpu_seconds, server))
                for streams in levels:
                    result = await run_level(channel, server.model_name, MODES[2], streams,
                                             prompts[streams], NEW_TOKENS,
                                             partial(cpu_seconds, server))
                    row = result.row
                    rows.append(_report(HostPathRow(MODES[2], streams, row.requests, row.errors,
                                                    row.generated_tokens, row.wall_s,
                                                    row.cpu_s)))
                return rows

        return asyncio.run(drive())
    finally:
        server.stop()


async def _levels(mode: str, levels: Sequence[int], prompts: dict[int, Prompts],
                  warm_up: Prompts, one: Callable[[tuple[int, ...]], Awaitable[int]],
                  cpu_seconds: Callable[[], float]) -> list[HostPathRow]:
    """Closed loop: at each level, `streams` workers each send their next request as the
    previous one ends; `one` sends a request and returns the tokens it received."""
    await _closed_loop(warm_up, min(len(warm_up), max(levels)), one)
    rows = []
    for streams in levels:
        cpu_start, start = cpu_seconds(), time.perf_counter()
        tokens, errors = await _closed_loop(prompts[streams], streams, one)
        rows.append(_report(HostPathRow(mode, streams, len(prompts[streams]), errors, tokens,
                                        time.perf_counter() - start,
                                        cpu_seconds() - cpu_start)))
    return rows


async def _closed_loop(prompts: Prompts, streams: int,
                       one: Callable[[tuple[int, ...]], Awaitable[int]]) -> tuple[int, int]:
    pending = iter(prompts)
    tokens = errors = 0

    async def worker() -> None:
        nonlocal tokens, errors
        for prompt in pending:
            try:
                received = await one(prompt)
            except (grpc.aio.AioRpcError, EngineError):
                errors += 1
                continue
            tokens += received
            errors += received != NEW_TOKENS

    await asyncio.gather(*(worker() for _ in range(streams)))
    return tokens, errors


def _report(row: HostPathRow) -> HostPathRow:
    print(f"{row.mode}, {row.streams} streams: {row.tokens_per_s:,.0f} tokens/s, "
          f"{row.host_us_per_token:.1f} host µs per request-token, {row.errors} errors",
          flush=True)
    return row


def text_table(rows: Sequence[HostPathRow]) -> str:
    levels = sorted({row.streams for row in rows})
    lines = ["| mode | " + " | ".join(f"{streams} streams" for streams in levels) + " |",
             "|---|" + "---|" * len(levels)]
    for mode in MODES:
        by_level = {row.streams: row for row in rows if row.mode == mode}
        if by_level:
            lines.append(f"| {mode}: tokens/s (host µs per request-token) | " + " | ".join(
                f"{by_level[s].tokens_per_s:,.0f} ({by_level[s].host_us_per_token:.1f})"
                for s in levels) + " |")
    return "\n".join(lines)


def _write(out: Path, rows: Sequence[HostPathRow], levels: Sequence[int], duration_s: float,
           load_at_start: tuple[float, float, float]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / "host-path"
    details = {
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "processor": processor(),
        "cpu_count": os.cpu_count(),
        "duration_s": duration_s,
        # Other work on the machine slows every figure: its 1, 5 and 15 minute loads.
        "load_average_at_start": list(load_at_start),
        "workload": {"levels": list(levels), "prompt_tokens": PROMPT_TOKENS,
                     "max_new_tokens": NEW_TOKENS, "ignore_eos": True, "do_sample": False,
                     "model": "random Llama, 2 layers, hidden 32, float32",
                     "vocabulary": VOCABULARY, "max_batch_size": MAX_BATCH_SIZE,
                     "engine_threads": ENGINE_THREADS},
        "rows": [{"mode": row.mode, "streams": row.streams, "requests": row.requests,
                  "errors": row.errors, "tokens": row.tokens, "wall_s": row.wall_s,
                  "cpu_s": row.cpu_s, "tokens_per_s": row.tokens_per_s,
                  "host_us_per_token": row.host_us_per_token,
                  "cpu_us_per_token": row.cpu_us_per_token} for row in rows],
    }
    stem.with_suffix(".json").write_text(json.dumps(details, indent=2) + "\n")
    stem.with_suffix(".md").write_text(
        f"Host path, {details['timestamp']}, {details['processor']}, load average at start "
        f"{load_at_start[0]:.1f}\n\n{text_table(rows)}\n")
    print(f"wrote {stem}.json and .md")


def processor() -> str:
    """The CPU's model name (lscpu's), its family and model (which tell a generation apart
    where the name does not: AMD's EPYC family 25 model 17 is a Zen 4), and whether it has
    AVX-512."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        return platform.processor()
    text = cpuinfo.read_text()
    fields = dict(line.split(":", 1) for line in text.split("\n\n", 1)[0].splitlines()
                  if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    return (f"{fields.get('model name', platform.processor())} (family "
            f"{fields.get('cpu family', '?')}, model {fields.get('model', '?')}), "
            f"{'AVX-512' if ' avx512f' in text else 'no AVX-512'}")
