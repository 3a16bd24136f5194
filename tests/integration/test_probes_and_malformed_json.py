"""Against a real server over mutual TLS: a crowd of ProbeGeneration calls shares one
generation and takes nothing from the business limits (maxBatchSize + maxQueueLen), and JSON
inside a request's strings, however deep or long, is refused as INVALID_ARGUMENT naming its
field, never an exception's class name."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import grpc
import pytest

from switchboard.process import ServerProcess
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.proto import grpc_service_pb2_grpc as pb_grpc
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto import switchboard_pb2_grpc as sb_grpc

MODEL = "smollm2"
NUM_PROBES = 2000
BATCH, QUEUE = 2, 2  # maxBatchSize, maxQueueLen: canaries fill them exactly
CALL_TIMEOUT_S = 120
DEEP = 3000  # past Python's recursion limit


@pytest.fixture(scope="module")
def limited_server(pki, tmp_path_factory) -> Iterator[ServerProcess]:
    config = tmp_path_factory.mktemp("limited") / "config.json"
    config.write_text(json.dumps({"maxBatchSize": BATCH, "maxQueueLen": QUEUE}))
    server = ServerProcess("--tls-dir", str(pki.folder), "--config", str(config))
    server.wait_ready()
    yield server
    assert server.stop() == 0, server.log_text()


def credentials(client_files) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=client_files.ca.read_bytes(),
                                        private_key=client_files.key.read_bytes(),
                                        certificate_chain=client_files.cert.read_bytes())


def infer_request(**string_parameters: str) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=MODEL, parameters={
        "max_new_tokens": pb.InferParameter(int64_param=2),
        **{name: pb.InferParameter(string_param=value)
           for name, value in string_parameters.items()}})
    message.inputs.add(name="text_input", datatype="BYTES", shape=[1]) \
        .contents.bytes_contents.append(b"Hi")
    return message


def test_a_crowd_of_probes_shares_a_generation_and_causes_no_business_refusal(
        limited_server, client_files) -> None:
    """While 2,000 probes are in flight, rounds of as many canaries as the business limits
    admit are all served (each probe was once a request of its own, in flight past the limits:
    canaries got RESOURCE_EXHAUSTED), and every probe answers."""

    async def scenario() -> tuple[list[BaseException | None], list[object]]:
        async with grpc.aio.secure_channel(limited_server.address,
                                           credentials(client_files)) as channel:
            management = sb_grpc.ManagementStub(channel)
            inference = pb_grpc.GRPCInferenceServiceStub(channel)
            probes = asyncio.gather(*(management.ProbeGeneration(
                sb.ProbeGenerationRequest(), timeout=CALL_TIMEOUT_S)
                for _ in range(NUM_PROBES)), return_exceptions=True)
            refusals: list[BaseException | None] = []
            while not probes.done():
                rounds = await asyncio.gather(*(inference.ModelInfer(
                    infer_request(), timeout=CALL_TIMEOUT_S) for _ in range(BATCH + QUEUE)),
                    return_exceptions=True)
                refusals += [reply for reply in rounds if isinstance(reply, BaseException)]
            return refusals, await probes

    refusals, probes = asyncio.run(scenario())
    assert refusals == []
    failed = [probe for probe in probes if isinstance(probe, BaseException)]
    assert not failed, f"{len(failed)} probes failed, such as {failed[0]}"
    assert all(probe.latency_us > 0 for probe in probes)


@pytest.mark.parametrize(("field", "value", "says"), [
    ("stop", "[" * DEEP, "nested too deeply"),
    ("stop", '["' + "x" * 10 + '"', "is not a JSON array"),
    ("stop_token_ids", "[" + "9" * 5000 + "]", "is not a JSON array"),
])
def test_json_inside_a_string_parameter_is_refused_naming_it(limited_server, client_files,
                                                              field, value, says) -> None:
    with grpc.secure_channel(limited_server.address, credentials(client_files)) as channel:
        inference = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            inference.ModelInfer(infer_request(**{field: value}), timeout=CALL_TIMEOUT_S)
        assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT, raised.value
        assert field in raised.value.details() and says in raised.value.details()
        assert "Error" not in raised.value.details(), raised.value.details()
        assert inference.ModelInfer(infer_request(), timeout=CALL_TIMEOUT_S).outputs
