"""Closed-loop load over gRPC with our generated stubs: C workers, each sending its next
request when the previous one finishes; one `ModelStreamInfer` RPC per request, so the
streamed token responses time the first token (TTFT), the time per output token after it
(TPOT: the rest of the request's time over its other tokens) and the gaps between streamed
tokens (ITL)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.metrics import Row, make_row
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.proto import grpc_service_pb2_grpc as pb_grpc
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto import switchboard_pb2_grpc as sb_grpc

# The engine's own per-request timeout (600 s by default) must not cut a slow level short.
REQUEST_TIMEOUT_US = 3600 * 1_000_000


@dataclass(slots=True)
class Timing:
    """What one request measured: seconds to its first token, the gap before each token
    after it (a response of several tokens shares its gap among them). joins_running: sent by
    a worker after its first request, so into a batch of other streams decoding, rather than
    in the level's opening burst."""

    joins_running: bool
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        """Seconds per output token after the first (vLLM's TPOT, the baseline's)."""
        return sum(self.gaps_s) / len(self.gaps_s) if self.gaps_s else None


@dataclass(frozen=True, slots=True)
class LevelResult:
    row: Row
    errors: list[str]


def secure_channel(address: str, ca: Path, cert: Path, key: Path) -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes(),
                                               private_key=key.read_bytes(),
                                               certificate_chain=cert.read_bytes())
    return grpc.aio.secure_channel(address, credentials)


async def run_level(channel: grpc.aio.Channel, model_name: str, name: str, streams: int,
                    prompts: Sequence[tuple[int, ...]], max_new_tokens: int,
                    cpu_seconds: Callable[[], float]) -> LevelResult:
    """Send `prompts` through `streams` closed-loop workers; `cpu_seconds` reads the server's
    CPU time, for its utilisation over the level."""
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    pending = iter(prompts)
    timings: list[Timing] = []

    async def worker() -> None:
        for index, prompt in enumerate(pending):
            timings.append(await _one_request(stub, model_name, prompt, max_new_tokens,
                                              joins_running=index > 0))

    cpu_start, start = cpu_seconds(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(streams)))
    wall_s = time.perf_counter() - start
    cpu_s = cpu_seconds() - cpu_start
    errors = [timing.error for timing in timings if timing.error is not None]
    row = make_row(name, streams, len(timings), len(errors), sum(t.tokens for t in timings),
                   wall_s, cpu_s, [t.ttft_s for t in timings if t.ttft_s is not None],
                   [t.tpot_s for t in timings if t.tpot_s is not None],
                   [gap for t in timings for gap in t.gaps_s],
                   [t.ttft_s for t in timings if t.ttft_s is not None and t.joins_running])
    return LevelResult(row, errors)


async def speculation_counters(channel: grpc.aio.Channel) -> dict[str, float]:
    """The server's speculation counters so far (see its metrics), without their prefix:
    drafts (requests' verifying steps), draft_tokens, accepted_tokens, and
    accepted_tokens_per_pos_N (those accepted at position N of their guess)."""
    metrics = await sb_grpc.ManagementStub(channel).GetMetrics(sb.GetMetricsRequest())
    prefix = "vllm:spec_decode_num_"
    return {sample.name.removeprefix(prefix).removesuffix("_total")
            + (f"_{sample.labels['position']}" if "position" in sample.labels else ""):
            sample.value
            for family in text_string_to_metric_families(metrics.text)
            for sample in family.samples
            if sample.name.startswith(prefix) and sample.name.endswith("_total")}


def infer_request(model_name: str, prompt: tuple[int, ...],
             max_new_tokens: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model_name)
    request.inputs.add(name="input0", datatype="UINT32", shape=[len(prompt)])
    request.raw_input_contents.append(np.asarray(prompt, dtype="<u4").tobytes())
    request.parameters["max_new_tokens"].int64_param = max_new_tokens
    request.parameters["ignore_eos"].bool_param = True
    request.parameters["do_sample"].bool_param = False
    request.parameters["timeout"].int64_param = REQUEST_TIMEOUT_US
    return request


async def _one_request(stub: pb_grpc.GRPCInferenceServiceStub, model_name: str,
                       prompt: tuple[int, ...], max_new_tokens: int, *,
                       joins_running: bool) -> Timing:
    request = infer_request(model_name, prompt, max_new_tokens)

    async def requests() -> AsyncIterator[pb.ModelInferRequest]:
        yield request

    timing = Timing(joins_running)
    reported: int | None = None
    start = last = time.perf_counter()
    try:
        async for response in stub.ModelStreamInfer(requests()):
            now = time.perf_counter()
            if response.error_message:
                timing.error = response.error_message
                continue
            infer = response.infer_response
            # input0 is answered with output0: the response's new token ids as UINT32.
            count = len(infer.raw_output_contents[0]) // 4 if infer.raw_output_contents else 0
            if count:
                if timing.ttft_s is None:
                    timing.ttft_s = now - start
                else:
                    timing.gaps_s.extend([(now - last) / count] * count)
                timing.tokens += count
                last = now
            final = infer.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                reported = infer.parameters["generated_tokens"].int64_param
    except grpc.aio.AioRpcError as error:
        timing.error = f"{error.code().name}: {error.details()}"
    if timing.error is None and (reported, timing.tokens) != (max_new_tokens, max_new_tokens):
        timing.error = (f"expected {max_new_tokens} tokens; received {timing.tokens}, "
                        f"the final response reported {reported}")
    return timing
