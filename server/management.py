"""`switchboard.v1.Management`: MindIE's management operations that KServe v2 has no RPC for.

Those that change the server for everyone (StopService) need a management identity: a client
certificate whose common name the configuration names (the gateway's own by default, which
relays MindIE's /stopService from its management plane); any other client gets
PERMISSION_DENIED. The others read (GetStatus, GetSlotCount, GetMetrics, a shared
ProbeGeneration) or stop one request by its id (StopInfer, which MindIE's business plane
serves), and stay open to every client the TLS handshake admits."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from switchboard.engine.protocol import EngineClient
from switchboard.engine.errors import InvalidRequest, NotFound, RequestTimedOut
from switchboard.engine.validation import MAX_TIMEOUT_S, build_request
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto import switchboard_pb2_grpc as sb_grpc
from switchboard.server import codec
from switchboard.server.served_model import ServedModel
from switchboard.server.servicer import engine_errors

Response = TypeVar("Response")
PROBE_PROMPT = "Hello"
PROBE_TIMEOUT_S = 10.0


def management_only(rpc: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    """Refuse the RPC to a client without a management identity (PERMISSION_DENIED)."""

    @functools.wraps(rpc)
    async def checked(self: ManagementServicer, request: object,
                      context: grpc.aio.ServicerContext) -> Response:
        if self.management_identities is not None:
            names = {name.decode(errors="replace")
                     for name in context.auth_context().get("x509_common_name", ())}
            if not names & self.management_identities:
                await context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{rpc.__name__} needs a management identity: a client certificate whose "
                    f"common name the server's --management-identity names")
        return await rpc(self, request, context)

    return checked


class ManagementServicer(sb_grpc.ManagementServicer):
    """`stop_service(force)` drains the server and makes it exit (StopService).
    `management_identities`: the common names of the client certificates that may call the
    management operations; None without TLS (plaintext listens on loopback only)."""

    def __init__(self, served: ServedModel, stop_service: Callable[[bool], Awaitable[None]],
                 management_identities: frozenset[str] | None) -> None:
        self.served = served
        self.stop_service = stop_service
        self.management_identities = management_identities
        self._stop: asyncio.Future[None] | None = None
        self._probe: asyncio.Future[None] | None = None

    @engine_errors
    async def StopInfer(self, request: sb.StopInferRequest, context: grpc.aio.ServicerContext
                        ) -> sb.StopInferResponse:
        engine = self.served.named_engine(request.model_name)
        if not request.id:
            raise InvalidRequest("id", "is required: the id of the request to stop")
        codec.check_client_id(request.id)
        request_ids = self.served.request_ids(request.id)
        if not request_ids:
            raise NotFound(f"no running request has id {request.id!r}")
        for request_id in request_ids:
            engine.stop(request_id)
        return sb.StopInferResponse(num_stopped=len(request_ids))

    @engine_errors
    async def GetSlotCount(self, request: sb.GetSlotCountRequest, context: grpc.aio.ServicerContext
                           ) -> sb.GetSlotCountResponse:
        stats = self.served.named_engine(request.model_name).stats()
        return sb.GetSlotCountResponse(
            total_slots=stats.max_batch_size,
            free_slots=stats.free_slots,
            available_tokens_length=stats.num_free_blocks * stats.block_size,
        )

    async def GetStatus(self, request: sb.GetStatusRequest, context: grpc.aio.ServicerContext
                        ) -> sb.GetStatusResponse:
        metrics = self.served.metrics
        response = sb.GetStatusResponse(
            ready=self.served.is_ready, stopping=self.served.stopping,
            mean_time_to_first_token_s=metrics.mean_time_to_first_token,
            mean_time_between_tokens_s=metrics.mean_time_between_tokens)
        if self.served.engine is not None:
            stats = self.served.engine.stats()
            response.max_running_requests = stats.max_batch_size
            response.running_requests = stats.num_running
            response.waiting_requests = stats.num_waiting
            response.free_blocks = stats.num_free_blocks
            response.total_blocks = stats.num_total_blocks
            response.block_size = stats.block_size
            response.preemptions = stats.num_preemptions
            response.free_slots = stats.free_slots
        return response

    async def GetMetrics(self, request: sb.GetMetricsRequest, context: grpc.aio.ServicerContext
                         ) -> sb.GetMetricsResponse:
        return sb.GetMetricsResponse(text=self.served.metrics.exposition())

    @engine_errors
    async def ProbeGeneration(self, request: sb.ProbeGenerationRequest,
                              context: grpc.aio.ServicerContext) -> sb.ProbeGenerationResponse:
        """Probes at the same time share one generation: a crowd of them costs one request,
        which counts against no business limit. Each waits for it within its own deadline."""
        start = time.monotonic()
        engine = self.served.ready_engine()
        if self._probe is None or self._probe.done():
            self._probe = asyncio.ensure_future(_probe_generation(engine))
            self._probe.add_done_callback(_retrieve_error)  # if every caller has left
        remaining = context.time_remaining()
        try:
            await asyncio.wait_for(asyncio.shield(self._probe),
                                   PROBE_TIMEOUT_S if remaining is None else remaining)
        except TimeoutError:
            raise RequestTimedOut("the probe generation did not finish in time") from None
        return sb.ProbeGenerationResponse(
            latency_us=round((time.monotonic() - start) * codec.MICROSECONDS))

    @management_only
    async def StopService(self, request: sb.StopServiceRequest, context: grpc.aio.ServicerContext
                          ) -> sb.StopServiceResponse:
        if self.served.stopping:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "a graceful stop is already under way")
        self._stop = asyncio.ensure_future(self.stop_service(request.force))
        await asyncio.shield(self._stop)  # the stop goes on if the caller leaves
        return sb.StopServiceResponse()


async def _probe_generation(engine: EngineClient) -> None:
    """One token of PROBE_PROMPT; it may run as long as a request may, while probes wait."""
    spec = dataclasses.replace(build_request(
        f"probe-{uuid.uuid4().hex}", await engine.prompts.encode(PROBE_PROMPT),
        {"max_new_tokens": 1, "timeout": MAX_TIMEOUT_S, "do_sample": False}, engine.limits),
        probe=True)
    async with contextlib.aclosing(engine.generate(spec)) as events:
        async for _ in events:
            pass


def _retrieve_error(probe: asyncio.Future[None]) -> None:
    if not probe.cancelled():
        probe.exception()
