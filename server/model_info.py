"""What the server says about its model: KServe v2 metadata, Triton's model config and
statistics, and the limits of switchboard.v1's generation parameters."""

from __future__ import annotations

import math

from switchboard.engine.protocol import EngineClient
from switchboard.engine.validation import MAX_STOP_SEQUENCES, MAX_TOP_LOGPROBS, parameter_limits
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.proto import model_config_pb2 as mc
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto.vllm_backend_tensors import CONTROL_INPUTS, EXTRA_OUTPUTS
from typing import TYPE_CHECKING

from switchboard.server.codec import MODEL_VERSION, InputKind

if TYPE_CHECKING:
    from switchboard.server.metrics import Duration, InferenceTotals

PLATFORM = "switchboard"
# Triton extensions this server implements (ServerMetadataResponse.extensions).
EXTENSIONS = ("model_configuration", "parameters", "schedule_policy", "statistics")
# Devices the model is spread over: one (no tensor parallelism).
WORLD_SIZE = 1

_TENSOR_SHAPES = {
    InputKind.TOKENS: ([-1], [1, -1]),
    InputKind.TEXT: ([1], [1]),
}
_CONFIG_TYPES = {"UINT32": mc.TYPE_UINT32, "BYTES": mc.TYPE_STRING, "BOOL": mc.TYPE_BOOL}
_VLLM_OUTPUTS = {name: datatype for name, (_, datatype) in EXTRA_OUTPUTS.items()}


def _tensors() -> tuple[list[tuple[str, str, list[int]]], list[tuple[str, str, list[int]]]]:
    """The model's inputs and outputs: (name, datatype, shape) each."""
    inputs = [(kind.input_name, kind.datatype, shape)
              for kind, (shape, _) in _TENSOR_SHAPES.items()]
    outputs = [(kind.output_name, kind.datatype, shape)
               for kind, (_, shape) in _TENSOR_SHAPES.items()]
    inputs += [(name, datatype, [1]) for name, datatype in CONTROL_INPUTS.items()]
    outputs += [(name, datatype, [1]) for name, datatype in _VLLM_OUTPUTS.items()]
    return inputs, outputs


def server_metadata(version: str) -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(name=PLATFORM, version=version, extensions=EXTENSIONS)


def model_metadata(model_name: str) -> pb.ModelMetadataResponse:
    response = pb.ModelMetadataResponse(name=model_name, versions=[MODEL_VERSION], platform=PLATFORM)
    inputs, outputs = _tensors()
    for name, datatype, shape in inputs:
        response.inputs.add(name=name, datatype=datatype, shape=shape)
    for name, datatype, shape in outputs:
        response.outputs.add(name=name, datatype=datatype, shape=shape)
    return response


def model_config(model_name: str, engine: EngineClient | None) -> pb.ModelConfigResponse:
    """Every input is optional: a request carries input0 or text_input, the latter with the
    vLLM backend's control inputs or not. Decoupled, since streaming sends one response per
    token. Once the model is loaded, `parameters` carry its limits and the engine's static
    configuration (MindIE's /v1/config reads them)."""
    config = mc.ModelConfig(name=model_name, platform=PLATFORM, backend=PLATFORM, max_batch_size=0,
                            model_transaction_policy=mc.ModelTransactionPolicy(decoupled=True))
    inputs, outputs = _tensors()
    for name, datatype, shape in inputs:
        config.input.add(name=name, data_type=_CONFIG_TYPES[datatype], dims=shape, optional=True)
    for name, datatype, shape in outputs:
        config.output.add(name=name, data_type=_CONFIG_TYPES[datatype], dims=shape)
    if engine is not None:
        limits, info = engine.limits, engine.info
        for key, value in (("max_seq_len", limits.max_seq_len),
                           ("max_input_len", limits.max_input_len),
                           ("max_prompt_bytes", limits.max_prompt_bytes),
                           ("max_iter_times", limits.max_iter_times),
                           ("vocab_size", limits.vocab_size),
                           ("max_sequences", limits.max_best_of),
                           ("max_stop_sequences", MAX_STOP_SEQUENCES),
                           ("max_top_logprobs", MAX_TOP_LOGPROBS),
                           ("max_running_requests", info.max_batch_size),
                           ("max_waiting_requests", info.max_waiting_requests),
                           ("block_size", info.block_size),
                           ("num_kv_blocks", info.num_kv_blocks),
                           ("kv_cache_bytes", info.kv_cache_bytes),
                           ("device", info.device),
                           ("dtype", info.dtype),
                           ("quantization", info.quantization),
                           ("world_size", WORLD_SIZE)):
            config.parameters[key].string_value = str(value)
    return pb.ModelConfigResponse(config=config)


def parameter_limits_pb(engine: EngineClient) -> sb.GetParameterLimitsResponse:
    """The engine's limits of each parameter (`parameter_limits`); an infinite bound is
    none."""
    response = sb.GetParameterLimitsResponse()
    for name, limits in parameter_limits(engine.limits).items():
        published = response.parameters[name]
        published.min_items, published.min_length = limits.min_items, limits.min_length
        if limits.max_items is not None:
            published.max_items = limits.max_items
        if (interval := limits.interval) is not None:
            if not math.isinf(interval.low):
                published.minimum = interval.low
                published.exclusive_minimum = interval.low_open
            if not math.isinf(interval.high):
                published.maximum = interval.high
                published.exclusive_maximum = interval.high_open
    return response


def model_statistics(model_name: str, totals: InferenceTotals,
                     num_steps: int) -> pb.ModelStatisticsResponse:
    """Triton's statistics of the served model: an inference is a request that succeeded, an
    execution an engine step (a step computes many requests' tokens at once). Every duration
    is set, those not measured here to zero, as Triton writes them all."""
    measured = {"success": totals.success, "fail": totals.fail, "queue": totals.queue,
                "compute_infer": totals.compute_infer}

    def duration(value: Duration | None) -> pb.StatisticDuration:
        return pb.StatisticDuration() if value is None else pb.StatisticDuration(
            count=value.count, ns=value.ns)

    return pb.ModelStatisticsResponse(model_stats=[pb.ModelStatistics(
        name=model_name, version=MODEL_VERSION, last_inference=totals.last_inference_ms,
        inference_count=totals.success.count, execution_count=num_steps,
        inference_stats=pb.InferStatistics(**{
            field.name: duration(measured.get(field.name))
            for field in pb.InferStatistics.DESCRIPTOR.fields}))])
