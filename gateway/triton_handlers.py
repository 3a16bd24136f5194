"""Routes of the Triton / KServe v2 family (MindIE's EndPoint table): health, metadata, config,
statistics, /infer, /generate, /generate_stream, stopInfer and getSlotCount."""

from __future__ import annotations

import grpc

from switchboard.gateway import dmi
from switchboard.gateway.errors import KSERVE_HTTP_STATUS, RequestError
from switchboard.gateway.handler import METADATA_TIMEOUT_S, Handler
from switchboard.gateway.protocols import kserve, triton
from switchboard.gateway.protocols.kserve import optional_string, require_object
from switchboard.gateway.sse import sse_event
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.proto import switchboard_pb2 as sb


class ServerLiveHandler(Handler):
    async def get(self) -> None:
        response = await self.track(self.upstream.inference.ServerLive(
            pb.ServerLiveRequest(), timeout=METADATA_TIMEOUT_S))
        self._answer(response.live, "the server is not live")

    def _answer(self, ok: bool, message: str) -> None:
        if not ok:
            raise RequestError(503, message)
        self.finish_empty()


class ServerReadyHandler(ServerLiveHandler):
    async def get(self) -> None:
        self._answer(await self.is_server_ready(),
                     "the model is not ready (still loading, or stopping)")


class ModelReadyHandler(ServerLiveHandler):
    async def get(self, model: str, version: str | None = None) -> None:
        """404 for a model or version not served (MindIE's route: the model must exist), which
        the server's ModelReady answers as not ready, as Triton's does."""
        await self.track(self.upstream.inference.ModelMetadata(
            pb.ModelMetadataRequest(name=model, version=version or ""), timeout=METADATA_TIMEOUT_S))
        response = await self.track(self.upstream.inference.ModelReady(
            pb.ModelReadyRequest(name=model, version=version or ""), timeout=METADATA_TIMEOUT_S))
        self._answer(response.ready and not self.services.lifecycle.stopping,
                     f"model {model!r} is not ready")


class ServerMetadataHandler(Handler):
    async def get(self) -> None:
        response = await self.track(self.upstream.inference.ServerMetadata(
            pb.ServerMetadataRequest(), timeout=METADATA_TIMEOUT_S))
        self.write_json(kserve.server_metadata_json(response))


class ModelMetadataHandler(Handler):
    async def get(self, model: str, version: str | None = None) -> None:
        response = await self.track(self.upstream.inference.ModelMetadata(
            pb.ModelMetadataRequest(name=model, version=version or ""), timeout=METADATA_TIMEOUT_S))
        self.write_json(kserve.model_metadata_json(response))


class ModelConfigHandler(Handler):
    async def get(self, model: str, version: str | None = None) -> None:
        response = await self.track(self.upstream.inference.ModelConfig(
            pb.ModelConfigRequest(name=model, version=version or ""), timeout=METADATA_TIMEOUT_S))
        self.write_json(kserve.model_config_json(response.config))


class RepositoryIndexHandler(Handler):
    async def post(self) -> None:
        response = await self.track(self.upstream.inference.RepositoryIndex(
            kserve.repository_index_request(self.body), timeout=METADATA_TIMEOUT_S))
        self.write_json(kserve.repository_index_json(response))


class ModelStatisticsHandler(Handler):
    async def get(self, model: str | None = None, version: str | None = None) -> None:
        """No model in the path: every model's."""
        response = await self.track(self.upstream.inference.ModelStatistics(
            pb.ModelStatisticsRequest(name=model or "", version=version or ""),
            timeout=METADATA_TIMEOUT_S))
        self.write_json(kserve.model_statistics_json(response))


class InferHandler(Handler):
    runs_inference = True

    async def post(self, model: str, version: str | None = None) -> None:
        target = dmi.prefill_target(self)
        document, binary = kserve.split_body(self.body,
                                             self.request.headers.get(kserve.HEADER_LENGTH))
        request, options = kserve.infer_request_to_pb(model, version or "", document, binary)
        deadline_s = await self.call_deadline_s(request)
        if dmi.is_leg(self.request.headers):
            await dmi.answer(self, dmi.kserve_leg(request, options, deadline_s, self.upstream),
                             target)
            return
        response = await self.track(self.upstream.inference.ModelInfer(request,
                                                                       timeout=deadline_s))
        reply = kserve.infer_response_to_http(response, options)
        if reply.header_length is None:
            self.set_header("Content-Type", "application/json")
        else:
            self.set_header("Content-Type", "application/octet-stream")
            self.set_header(kserve.HEADER_LENGTH, str(reply.header_length))
        self.finish(reply.body)


class GenerateHandler(Handler):
    """/generate: the stream's responses aggregated into one reply."""

    runs_inference = True
    streams = False

    async def post(self, model: str, version: str | None = None) -> None:
        if (started := await self._start(model, version)) is None:
            return
        call, stream = started
        async for response in call:
            stream.add(response.infer_response)
        self.write_json(stream.reply())

    async def _start(self, model: str, version: str | None
                     ) -> tuple[grpc.aio.UnaryStreamCall,
                                triton.GenerateStream | triton.TritonReplies] | None:
        """The call and what renders its responses; None for a DMI leg, answered."""
        target = dmi.prefill_target(self)
        request, options = triton.generate_request_to_pb(model, version or "",
                                                         kserve.parse_json(self.body),
                                                         self.streams)
        self.names = options.names
        deadline_s = await self.call_deadline_s(request)
        if dmi.is_leg(self.request.headers):
            await dmi.answer(self, dmi.triton_leg(request, options, self.streams, deadline_s,
                                                  self.upstream), target)
            return None
        call = self.upstream.generation.InferStream(request, timeout=deadline_s)
        return self.track(call), triton.reply_stream(options)


class GenerateStreamHandler(GenerateHandler):
    """/generate_stream: one SSE event per response. An error before the first event is an HTTP
    error; after it, an `{"error": ...}` event ends the stream (Triton's generate extension)."""

    streams = True

    async def post(self, model: str, version: str | None = None) -> None:
        if (started := await self._start(model, version)) is None:
            return
        call, stream = started
        await self.relay(call, lambda response: [sse_event(stream.add(response.infer_response))])


class StopInferHandler(Handler):
    # MindIE's stopInfer answers 422 for a missing or invalid id (a body that is not JSON: 400).
    status_table = {**KSERVE_HTTP_STATUS, grpc.StatusCode.INVALID_ARGUMENT: 422}

    async def post(self, model: str, version: str | None = None) -> None:
        document = require_object(kserve.parse_json(self.body), "the body")
        request_id = optional_string(document, "id") or ""
        response = await self.track(self.upstream.management.StopInfer(
            sb.StopInferRequest(model_name=model, id=request_id), timeout=METADATA_TIMEOUT_S))
        self.write_json({"id": request_id, "num_stopped": response.num_stopped})


class SlotCountHandler(Handler):
    async def get(self, model: str) -> None:
        response = await self.track(self.upstream.management.GetSlotCount(
            sb.GetSlotCountRequest(model_name=model), timeout=METADATA_TIMEOUT_S))
        self.write_json({"total_slots": response.total_slots, "free_slots": response.free_slots,
                         "available_tokens_length": response.available_tokens_length})
