"""The gateway's gRPC client of the server: one channel, mutual TLS with our own certificate."""

from __future__ import annotations

import grpc

from gateway.config import UpstreamConfig
from proto import grpc_service_pb2_grpc as pb_grpc
from proto import switchboard_pb2_grpc as sb_grpc

# Stream errors as gRPC statuses rather than in-band messages (Triton's header), so that each
# status maps to its HTTP status.
STATUS_ERRORS = (("triton_grpc_error", "true"),)
MAX_MESSAGE_BYTES = 256 * 1024 * 1024


class Upstream:
    def __init__(self, config: UpstreamConfig) -> None:
        options = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        credentials = config.credentials()
        self.target = config.target
        self.channel = (grpc.aio.secure_channel(config.target, credentials, options)
                        if credentials is not None
                        else grpc.aio.insecure_channel(config.target, options))
        self.inference = pb_grpc.GRPCInferenceServiceStub(self.channel)
        self.management = sb_grpc.ManagementStub(self.channel)
        self.generation = sb_grpc.GenerationStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()
