"""`switchboard.v1.Management`: MindIE's management operations that KServe v2 has no RPC for."""

from __future__ import annotations

import grpc

from engine.errors import NotFound
from proto import switchboard_pb2 as sb
from proto import switchboard_pb2_grpc as sb_grpc
from server.served_model import ServedModel
from server.servicer import engine_errors


class ManagementServicer(sb_grpc.ManagementServicer):
    def __init__(self, served: ServedModel) -> None:
        self.served = served

    @engine_errors
    async def StopInfer(self, request: sb.StopInferRequest, context: grpc.aio.ServicerContext
                        ) -> sb.StopInferResponse:
        self.served.check_model(request.model_name)
        engine = self.served.ready_engine()
        request_ids = self.served.request_ids(request.id)
        if not request.id or not request_ids:
            raise NotFound(f"no running request has id {request.id!r}")
        for request_id in request_ids:
            engine.stop(request_id)
        return sb.StopInferResponse(num_stopped=len(request_ids))

    @engine_errors
    async def GetSlotCount(self, request: sb.GetSlotCountRequest, context: grpc.aio.ServicerContext
                           ) -> sb.GetSlotCountResponse:
        self.served.check_model(request.model_name)
        stats = self.served.ready_engine().stats()
        claimed = stats.num_running + stats.num_waiting
        return sb.GetSlotCountResponse(
            total_slots=stats.max_batch_size,
            free_slots=max(0, stats.max_batch_size - claimed),
            available_tokens_length=stats.num_free_blocks * stats.block_size,
        )
