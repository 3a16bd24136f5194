"""`python -m bench [--quick]`: start the real server and the gateway in front of it, load the
server at each concurrency level over gRPC, then through the gateway's streamed OpenAI route
(mutual TLS, what users call), and (`--against-llama-server PATH`) llama.cpp's llama-server on
the same GGUF file with the same prompts and client; run the transformers baselines on the
same model while the servers idle, then (`--turns`) the compared levels and baselines again,
in turn; stop them, then print and write the report."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import TypeVar

import psutil
import torch
import transformers
from transformers import AutoTokenizer

from bench import host_path, prefill_decode, report
from bench.baseline import Baseline
from bench.grpc_load import run_level, secure_channel, speculation_counters
from bench.levels import LevelResult
from bench.llama_server import LlamaServer
from bench.metrics import Row, cpu_seconds
from bench.openai_load import Endpoint, mutual_tls, run_openai_level
from bench.workload import PARAGRAPH, PromptSource
from switchboard.engine.config import DTYPES, QUANTIZATIONS
from switchboard.engine.loader import default_model_path, hf_folder, resolve_device, resolve_dtype
from switchboard.engine.quantization import resolve_scheme
from switchboard.cli import default_cache_dir
from switchboard.process import GatewayProcess, ServerProcess
from switchboard.tls import DevPKIPaths, write_dev_pki

RESULTS_DIR = Path(__file__).resolve().parent / "results"
BATCH_SIZE = 16  # the static batch the 16-stream level is compared with
LARGE_BATCH_SIZE = 64  # quantized runs: the static batch the 64-stream level is compared with
FULL_LEVELS = (1, 4, 16, 64)
QUICK_LEVELS = (1, 4)
FULL_NEW_TOKENS = 64
QUICK_NEW_TOKENS = 16
WARM_UP_TOKENS = 4
TURNS = 2
MAX_ERRORS_KEPT = 20
OPENAI_ROUTE = "openai via gateway"
LLAMA_SERVER = "llama-server"

Prompts = list[tuple[int, ...]]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LevelRun:
    """One turn of a level: its figures, and the server's speculation counters over it."""

    result: LevelResult
    speculation: dict[str, float]


@dataclass(frozen=True, slots=True)
class Route:
    """A streamed OpenAI route the levels also run on, and the CPU time of what serves it."""

    endpoint: Endpoint
    cpu_seconds: Callable[[], float]


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.host_path:
        return host_path.run(args.levels or host_path.LEVELS, args.out)
    if args.prefill_decode:
        return prefill_decode.run(args.out, ("--quantization", args.quantization))
    levels = args.levels or (QUICK_LEVELS if args.quick else FULL_LEVELS)
    new_tokens = args.max_new_tokens or (QUICK_NEW_TOKENS if args.quick else FULL_NEW_TOKENS)
    if new_tokens < 2:
        sys.exit("--max-new-tokens must be at least 2 (TPOT needs two tokens)")
    if args.turns < 1:
        sys.exit("--turns must be at least 1")
    counts = [max(args.requests_per_stream * streams, args.min_requests) for streams in levels]
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    served = args.model or default_model_path()
    if args.against_llama_server and not os.access(args.against_llama_server, os.X_OK):
        sys.exit(f"--against-llama-server: {args.against_llama_server} is not an executable "
                 "file (docs/performance-defaults.md says how to build llama-server)")
    if args.against_llama_server and served.suffix != ".gguf":
        sys.exit("--against-llama-server serves a .gguf file: give --model one")
    scheme = resolve_scheme(args.quantization, served, device, dtype,
                            dtype_asked=args.dtype != "auto")
    quantized = scheme != "none"
    # The baseline loads the Hugging Face folder; the server gets the model as given (a .gguf
    # file too, which --quantization gguf reads its precisions from).
    model = hf_folder(served, default_cache_dir())
    load_at_start = os.getloadavg()
    started = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="switchboard-bench-") as folder:
        pki = write_dev_pki(Path(folder))
        print("starting the server (its first start on a machine converts the model, ~30 s)",
              flush=True)
        server = ServerProcess("--tls-dir", str(pki.folder), "--quantization", args.quantization,
                               "--model", str(served), "--device", device.type,
                               *(["--dtype", args.dtype] if args.dtype != "auto" else []),
                               "--speculate", str(args.speculate),
                               *(["--config", str(args.server_config)] if args.server_config else []))
        gateway = llama_server = None
        try:
            server.wait_ready()
            gateway = GatewayProcess("--tls-dir", str(pki.folder), "--upstream", server.address,
                                     "--http-port", "0", "--management-port", "0",
                                     "--metrics-port", "0")
            gateway.wait_ready()
            if args.against_llama_server:
                llama_server = LlamaServer(args.against_llama_server, served,
                                           torch.get_num_threads())
                asyncio.run(llama_server.wait_ready())
            routes = _routes(server, gateway, llama_server, pki)
            tokenizer = AutoTokenizer.from_pretrained(model)
            source = PromptSource(tokenizer.encode(PARAGRAPH, add_special_tokens=False),
                                  args.seed, args.prompt_min, args.prompt_max)
            warm_up = source.draw(1)
            level_prompts = {streams: source.draw(count)
                             for streams, count in zip(levels, counts, strict=True)}
            batch_sizes = [BATCH_SIZE, *([LARGE_BATCH_SIZE] if quantized and 64 in levels
                                         else [])]
            # The levels compared with a baseline; the one-at-a-time baseline runs the
            # prompts of the 1-stream level (else of the first).
            compared = [streams for streams in levels if streams in (1, batch_sizes[-1])]
            turn_prompts = level_prompts
            turn_single = level_prompts.get(1, level_prompts[levels[0]])
            turn_sizes = batch_sizes
            baseline = Baseline(model, tokenizer.eos_token_id, device, dtype)
            level_turns: list[dict[int, LevelRun]] = []
            route_turns: list[dict[str, dict[int, LevelResult]]] = []
            baseline_turns: list[list[Row]] = []
            server_cpu_while_baselines = 0.0
            turns = args.turns if compared else 1  # nothing to compare: no more turns
            for turn in range(turns):
                if turn:
                    print(f"turn {turn + 1} of {turns}: the compared levels and baselines "
                          "again, with fresh prompts of the same lengths", flush=True)
                    turn_prompts = {streams: source.draw_like(turn_prompts[streams])
                                    for streams in compared}
                    turn_single = turn_prompts.get(1) or source.draw_like(turn_single)
                    turn_sizes = batch_sizes[-1:]
                batch_prompts = [_static_batches(turn_prompts, size, source)
                                 for size in turn_sizes]
                if turn == 0:
                    static_batches = {size: len(batches)
                                      for size, batches in zip(batch_sizes, batch_prompts)}
                level_turns.append(asyncio.run(_drive(server, pki, warm_up, turn_prompts,
                                                      new_tokens)))
                # Prompts of their own (fresh, of the same lengths), the same for each route.
                route_prompts = {streams: source.draw_like(prompts)
                                 for streams, prompts in turn_prompts.items()}
                route_turns.append({name: asyncio.run(_drive_route(name, route, warm_up,
                                                                   route_prompts, new_tokens))
                                    for name, route in routes.items()})
                cpu_before = cpu_seconds(server)
                baseline_turns.append(_baselines(baseline, warm_up, turn_single, batch_prompts,
                                                 new_tokens))
                server_cpu_while_baselines += cpu_seconds(server) - cpu_before
            server_peak_rss = server.peak_rss_bytes()
        finally:
            for process in (llama_server, gateway, server):
                if process is not None:
                    process.stop()

    runs = {streams: _fastest([turn[streams] for turn in level_turns if streams in turn],
                              lambda run: run.result.row)
            for streams in levels}
    one_at_a_time = _fastest([turn[0] for turn in baseline_turns])
    batches = [*baseline_turns[0][1:-1], _fastest([turn[-1] for turn in baseline_turns])]
    baseline_peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    level_rows = {streams: run.result.row for streams, run in runs.items()}
    route_rows = {name: {streams: _fastest([turn[name][streams].row for turn in route_turns
                                            if streams in turn[name]])
                         for streams in route_turns[0][name]}
                  for name in route_turns[0]}
    rows = [*level_rows.values(), *(row for by_level in route_rows.values()
                                    for row in by_level.values()),
            one_at_a_time, *batches]
    goals = (report.quantized_targets(level_rows, one_at_a_time, batches[-1], server_peak_rss)
             if quantized else
             report.targets(level_rows, one_at_a_time, batches[0], server_peak_rss))
    if llama_server is not None:
        goals += report.llama_server_targets(route_rows[OPENAI_ROUTE],
                                             route_rows[LLAMA_SERVER], server_peak_rss)
    errors = [*(message for turn in level_turns for run in turn.values()
                for message in run.result.errors),
              *(message for turn in route_turns for by_level in turn.values()
                for result in by_level.values() for message in result.errors)]
    duration_s = time.perf_counter() - started

    print()
    print(report.text_table(rows, goals))
    print(f"\nserver peak RSS {server_peak_rss / report.GIB:.2f} GiB; bench process peak RSS "
          f"(the baseline) {baseline_peak_rss / report.GIB:.2f} GiB; "
          f"run took {duration_s / 60:.1f} min")
    for message in errors[:5]:
        print(f"error: {message}")

    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / "-".join(["quick" if args.quick else "latest",
                                *([scheme] if quantized else []),
                                *([f"speculate{args.speculate}"] if args.speculate else []),
                                *([device.type] if device.type != "cpu" else []),
                                *([args.model.stem] if args.model else [])])
    details = {
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "quick": args.quick,
        "duration_s": duration_s,
        "machine": _machine(load_at_start),
        "workload": {"levels": list(levels), "requests": counts, "max_new_tokens": new_tokens,
                     "ignore_eos": True, "do_sample": False,
                     "prompt_tokens": [args.prompt_min, args.prompt_max], "seed": args.seed,
                     "turns": turns,
                     # By size: how many static batches ran (a turn).
                     "static_batches": static_batches},
        "quantization": scheme,
        "against_llama_server": args.against_llama_server and str(args.against_llama_server),
        "speculate": args.speculate,
        # By level: requests' verifying steps, guessed tokens verified, and accepted.
        "speculation": ({streams: run.speculation for streams, run in runs.items()}
                        if args.speculate else None),
        "model": str(served),
        "device": _device_name(device),
        "dtype": str(dtype).removeprefix("torch."),
        "server_config": args.server_config and json.loads(args.server_config.read_text()),
        "server_peak_rss_bytes": server_peak_rss,
        # The idle server's CPU time while the baselines ran: near 0, else it skewed them.
        "server_cpu_s_while_baselines": server_cpu_while_baselines,
        "baseline_peak_rss_bytes": baseline_peak_rss,
        "errors": errors[:MAX_ERRORS_KEPT],
        # By row: tokens/s of each of its turns (the rows show the fastest).
        "turns": _turns_tokens_per_s(level_turns, baseline_turns),
    }
    report.write_json(stem.with_suffix(".json"), rows, goals, details)
    stem.with_suffix(".md").write_text(report.markdown(rows, goals))
    report.plot(stem.with_suffix(".png"), level_rows, [one_at_a_time, *batches])
    print(f"wrote {stem}.json, .md and .png")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help=f"a short smoke run: levels {','.join(map(str, QUICK_LEVELS))}, "
                             f"{QUICK_NEW_TOKENS} new tokens, results written as quick.* "
                             "instead of latest.*")
    parser.add_argument("--host-path", action="store_true",
                        help="the serving path's own cost per token instead: a tiny random "
                             "model in process and through gRPC, unary and streamed "
                             f"(levels {','.join(map(str, host_path.LEVELS))}); see "
                             "docs/host-path.md")
    parser.add_argument("--prefill-decode", action="store_true",
                        help="prefill/decode disaggregation instead: two servers, one "
                             "prefilling and one decoding, against one server alone, and the "
                             "KV transfer of a 1,000-token prompt; see docs/prefill-decode.md")
    parser.add_argument("--levels", type=_levels,
                        help="comma-separated numbers of concurrent streams "
                             f"(default: {','.join(map(str, FULL_LEVELS))})")
    parser.add_argument("--max-new-tokens", type=int,
                        help=f"tokens generated per request (default: {FULL_NEW_TOKENS})")
    parser.add_argument("--requests-per-stream", type=int, default=2,
                        help="a level sends max(this × streams, --min-requests) requests "
                             "(default: 2)")
    parser.add_argument("--min-requests", type=int, default=4, help="(default: 4)")
    parser.add_argument("--prompt-min", type=int, default=32,
                        help="shortest prompt, in tokens (default: 32)")
    parser.add_argument("--prompt-max", type=int, default=160,
                        help="longest prompt, in tokens (default: 160)")
    parser.add_argument("--turns", type=int, default=TURNS,
                        help="the levels compared with a baseline (1 stream; 16, or 64 when "
                             "quantized) and those baselines run this many times in turn, "
                             f"each side's fastest turn counted (default: {TURNS})")
    parser.add_argument("--seed", type=int, default=1234, help="workload seed (default: 1234)")
    parser.add_argument("--quantization", choices=QUANTIZATIONS, default="auto",
                        help="the server's --quantization; a quantized run is also compared "
                             "with transformers' static batch of 64 and written as "
                             "latest-<scheme>.* (default: auto, the server's default: gguf "
                             "for a .gguf model on CPU)")
    parser.add_argument("--against-llama-server", type=Path, metavar="PATH",
                        help="a llama.cpp llama-server binary: the OpenAI route's levels run "
                             "against it too, on the same GGUF file, and the report gives "
                             "issue 41's ratios (docs/performance-defaults.md builds one)")
    parser.add_argument("--speculate", type=int, default=0, metavar="N",
                        help="the server's --speculate (n-gram speculation, N guesses per "
                             "step); results are written as latest-...-speculateN.* "
                             "(default: 0, off)")
    parser.add_argument("--model", type=Path,
                        help="a Hugging Face folder or .gguf file for the server and the "
                             "baseline (default: the packaged SmolLM2); results are written as "
                             "latest-...-<its name>.*")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where the server and the baseline run (default: auto, CUDA if "
                             "present); results on a GPU are written as latest-...-cuda.*")
    parser.add_argument("--dtype", choices=DTYPES, default="auto",
                        help="the server's and the baseline's dtype (default: auto, float32 "
                             "on CPU, bfloat16 on GPU)")
    parser.add_argument("--server-config", type=Path,
                        help="a config file for the server (MindIE-style JSON keys)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR,
                        help="results folder (default: bench/results)")
    return parser


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}") from None
    if any(level < 1 for level in levels) or len(set(levels)) != len(levels):
        raise argparse.ArgumentTypeError("levels must be distinct positive integers")
    return levels


async def _drive(server: ServerProcess, pki: DevPKIPaths, warm_up: Prompts,
                 level_prompts: dict[int, Prompts], new_tokens: int) -> dict[int, LevelRun]:
    """One turn of the levels of `level_prompts`, by their numbers of streams."""
    runs: dict[int, LevelRun] = {}
    async with secure_channel(server.address, pki.ca_cert, pki.client_cert,
                              pki.client_key) as channel:
        await run_level(channel, server.model_name, "warm-up", 1, warm_up, WARM_UP_TOKENS,
                        partial(cpu_seconds, server))
        for streams, prompts in level_prompts.items():
            name = f"switchboard, {streams} stream{'s' if streams > 1 else ''}"
            print(f"{name}: {len(prompts)} requests of {new_tokens} tokens", flush=True)
            before = await speculation_counters(channel)
            result = await run_level(channel, server.model_name, name, streams, prompts,
                                     new_tokens, partial(cpu_seconds, server))
            after = await speculation_counters(channel)
            counts = {key: after[key] - before.get(key, 0.0) for key in after}
            runs[streams] = LevelRun(result, counts)
            guessed = counts.get("draft_tokens", 0.0)
            print(f"  {result.row.tokens_per_s:.1f} tokens/s, {result.row.errors} errors"
                  + (f"; {counts['accepted_tokens']:.0f} of {guessed:.0f} guessed tokens "
                     "accepted" if guessed else ""), flush=True)
    return runs


def _routes(server: ServerProcess, gateway: GatewayProcess, llama_server: LlamaServer | None,
            pki: DevPKIPaths) -> dict[str, Route]:
    """The gateway's OpenAI route (mutual TLS), and llama-server's where one runs."""
    routes = {OPENAI_ROUTE: Route(
        Endpoint(gateway.url("business"), server.model_name,
                 mutual_tls(pki.ca_cert, pki.client_cert, pki.client_key)),
        lambda: cpu_seconds(server) + cpu_seconds(gateway))}
    if llama_server is not None:
        routes[LLAMA_SERVER] = Route(Endpoint(llama_server.base_url, server.model_name),
                                     llama_server.cpu_seconds)
    return routes


async def _drive_route(name: str, route: Route, warm_up: Prompts,
                       level_prompts: dict[int, Prompts], new_tokens: int
                       ) -> dict[int, LevelResult]:
    """One turn of the levels of `level_prompts` on a streamed OpenAI route."""
    await run_openai_level(route.endpoint, f"{name} warm-up", 1, warm_up, WARM_UP_TOKENS,
                           route.cpu_seconds)
    results: dict[int, LevelResult] = {}
    for streams, prompts in level_prompts.items():
        label = f"{name}, {streams} stream{'s' if streams > 1 else ''}"
        print(f"{label}: {len(prompts)} requests of {new_tokens} tokens", flush=True)
        results[streams] = await run_openai_level(route.endpoint, label, streams, prompts,
                                                  new_tokens, route.cpu_seconds)
        print(f"  {results[streams].row.tokens_per_s:.1f} tokens/s, "
              f"{results[streams].row.errors} errors", flush=True)
    return results


def _static_batches(level_prompts: dict[int, Prompts], size: int, source: PromptSource
                    ) -> list[Prompts]:
    """The static batches of `size` compared with the level of as many streams: that level's
    own requests, `size` at a time (a batch of fresh prompts where that level sends fewer or
    is not run). Five static batches of the same 16 prompts, one after another, ran at 82-96
    tokens/s on the Zen 3: a batch alone is too noisy a baseline for a ratio against a whole
    level."""
    prompts = level_prompts.get(size, [])
    if len(prompts) < size:
        prompts = source.draw(size)
    return [prompts[start:start + size] for start in range(0, len(prompts) - size + 1, size)]


def _baselines(baseline: Baseline, warm_up: Prompts, single_prompts: Prompts,
               batch_prompts: Sequence[list[Prompts]], new_tokens: int) -> list[Row]:
    """transformers on the server's device and dtype: one at a time, then the static
    batches of each size."""
    print(f"transformers: {len(single_prompts)} prompts one at a time, then "
          + ", ".join(f"{len(batches)} static batch{'es' if len(batches) > 1 else ''} of "
                      f"{len(batches[0])}" for batches in batch_prompts), flush=True)
    baseline.warm_up(warm_up[0], WARM_UP_TOKENS)
    rows = [baseline.one_at_a_time(single_prompts, new_tokens),
            *(baseline.static_batches(batches, new_tokens) for batches in batch_prompts)]
    print("  " + ", ".join(f"{row.tokens_per_s:.1f} tokens/s" for row in rows), flush=True)
    return rows


def _fastest(turns: Sequence[T], row: Callable[[T], Row] = lambda row: row) -> T:
    """The turn of the most tokens/s: the machine is shared, and another's load only slows a
    turn down (our 16-stream level ran at 113-130 tokens/s in runs of the same code within
    hours; for the static batches' spread see `_static_batches`)."""
    return max(turns, key=lambda turn: row(turn).tokens_per_s)


def _turns_tokens_per_s(level_turns: Sequence[dict[int, LevelRun]],
                        baseline_turns: Sequence[list[Row]]) -> dict[str, list[float]]:
    turns: dict[str, list[float]] = {}
    for row in [run.result.row for turn in level_turns for run in turn.values()] + [
            row for turn in baseline_turns for row in turn]:
        turns.setdefault(row.name, []).append(row.tokens_per_s)
    return turns


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()


def _machine(load_at_start: tuple[float, float, float]) -> dict[str, object]:
    return {"processor": host_path.processor(), "cpu_count": os.cpu_count(),
            "physical_cores": psutil.cpu_count(logical=False),
            "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "transformers": transformers.__version__,
            # Other work on the machine skews every figure: its 1, 5 and 15 minute loads.
            "load_average_at_start": list(load_at_start)}


if __name__ == "__main__":
    sys.exit(main())
