"""What the server says about its model: KServe v2 metadata, Triton's model config and
statistics."""

from __future__ import annotations

from engine.protocol import EngineClient
from engine.validation import MAX_SEQUENCES, MAX_STOP_SEQUENCES, MAX_TOP_LOGPROBS
from proto import grpc_service_pb2 as pb
from proto import model_config_pb2 as mc
from typing import TYPE_CHECKING

from server.codec import InputKind

if TYPE_CHECKING:
    from server.metrics import Duration, InferenceTotals

PLATFORM = "switchboard"
MODEL_VERSION = "1"
# Triton extensions this server implements (ServerMetadataResponse.extensions).
EXTENSIONS = ("model_configuration", "parameters", "schedule_policy", "statistics")
# Devices the model is spread over: one (no tensor parallelism).
WORLD_SIZE = 1

_TENSOR_SHAPES = {
    InputKind.TOKENS: ([-1], [1, -1]),
    InputKind.TEXT: ([1], [1]),
}
_CONFIG_TYPES = {"UINT32": mc.TYPE_UINT32, "BYTES": mc.TYPE_STRING}


def server_metadata(version: str) -> pb.ServerMetadataResponse:
    return pb.ServerMetadataResponse(name=PLATFORM, version=version, extensions=EXTENSIONS)


def model_metadata(model_name: str) -> pb.ModelMetadataResponse:
    response = pb.ModelMetadataResponse(name=model_name, versions=[MODEL_VERSION], platform=PLATFORM)
    for kind, (input_shape, output_shape) in _TENSOR_SHAPES.items():
        response.inputs.add(name=kind.input_name, datatype=kind.datatype, shape=input_shape)
        response.outputs.add(name=kind.output_name, datatype=kind.datatype, shape=output_shape)
    return response


def model_config(model_name: str, engine: EngineClient | None) -> pb.ModelConfigResponse:
    """Both inputs are optional: a request carries one of them. Decoupled, since streaming
    sends one response per token. Once the model is loaded, `parameters` carry its limits and
    the engine's static configuration (MindIE's /v1/config reads them)."""
    config = mc.ModelConfig(name=model_name, platform=PLATFORM, backend=PLATFORM, max_batch_size=0,
                            model_transaction_policy=mc.ModelTransactionPolicy(decoupled=True))
    for kind, (input_shape, output_shape) in _TENSOR_SHAPES.items():
        data_type = _CONFIG_TYPES[kind.datatype]
        config.input.add(name=kind.input_name, data_type=data_type, dims=input_shape, optional=True)
        config.output.add(name=kind.output_name, data_type=data_type, dims=output_shape)
    if engine is not None:
        limits, info = engine.limits, engine.info
        for key, value in (("max_seq_len", limits.max_seq_len),
                           ("max_input_len", limits.max_input_len),
                           ("max_iter_times", limits.max_iter_times),
                           ("vocab_size", limits.vocab_size),
                           ("max_sequences", MAX_SEQUENCES),
                           ("max_stop_sequences", MAX_STOP_SEQUENCES),
                           ("max_top_logprobs", MAX_TOP_LOGPROBS),
                           ("max_running_requests", info.max_batch_size),
                           ("block_size", info.block_size),
                           ("num_kv_blocks", info.num_kv_blocks),
                           ("kv_cache_bytes", info.kv_cache_bytes),
                           ("device", info.device),
                           ("dtype", info.dtype),
                           ("quantization", info.quantization),
                           ("world_size", WORLD_SIZE)):
            config.parameters[key].string_value = str(value)
    return pb.ModelConfigResponse(config=config)


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
