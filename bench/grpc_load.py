"""Closed-loop load over gRPC with our generated stubs (see `levels.py`): one
`ModelStreamInfer` RPC per request, so the streamed token responses time the first token
(TTFT), the time per output token after it (TPOT: the rest of the request's time over its
other tokens) and the gaps between streamed tokens (ITL)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from functools import partial
from pathlib import Path

import grpc
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from bench.levels import LevelResult, Timing, run_level as run_closed_loop
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.proto import grpc_service_pb2_grpc as pb_grpc
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto import switchboard_pb2_grpc as sb_grpc

# The engine's own per-request timeout (600 s by default) must not cut a slow level short.
REQUEST_TIMEOUT_US = 3600 * 1_000_000


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
    return await run_closed_loop(name, streams, prompts,
                                 partial(_one_request, stub, model_name,
                                         max_new_tokens=max_new_tokens), cpu_seconds)


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
                       prompt: tuple[int, ...], joins_running: bool, *,
                       max_new_tokens: int) -> Timing:
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
                timing.add_tokens(count, now - start, now - last)
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
