"""The gateway's gRPC client of the server: one channel, mutual TLS with our own certificate."""

from __future__ import annotations

import asyncio
import math

import grpc

from switchboard.gateway.config import UpstreamConfig
from switchboard.proto import grpc_service_pb2_grpc as pb_grpc
from switchboard.proto.constants import GRPC_MESSAGE_OPTIONS
from switchboard.proto import switchboard_pb2_grpc as sb_grpc

# Reconnection attempts while the server is away: from 0.2 s apart, growing to 2 s at most
# (gRPC's default grows to 120 s), so that the gateway serves again soon after it is back.
RECONNECT_BACKOFF_MS = (200, 2000)


class Upstream:
    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self._retiring: set[asyncio.Task[None]] = set()
        self._connect(config.credentials())

    def _connect(self, credentials: grpc.ChannelCredentials | None) -> None:
        options = [*GRPC_MESSAGE_OPTIONS,
                   ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
                   ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
                   ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[1])]
        self.channel = (grpc.aio.secure_channel(self.config.target, credentials, options)
                        if credentials is not None
                        else grpc.aio.insecure_channel(self.config.target, options))
        self.inference = pb_grpc.GRPCInferenceServiceStub(self.channel)
        self.management = sb_grpc.ManagementStub(self.channel)
        self.generation = sb_grpc.GenerationStub(self.channel)

    def reload(self, credentials: grpc.ChannelCredentials) -> None:
        """Certificate rotation: new calls go over a new channel with these credentials (the
        files read again); the old channel closes once the calls on it have ended."""
        retired = self.channel
        self._connect(credentials)
        # Every call has a deadline, so waiting for the calls to end waits a bounded time.
        task = asyncio.ensure_future(retired.close(grace=math.inf))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def close(self) -> None:
        for task in self._retiring:
            task.cancel()
        await self.channel.close()
